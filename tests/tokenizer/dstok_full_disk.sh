#!/bin/bash
# dstok encode on a small file system: refused before encoding when the free space is below
# the estimate (one token per 6 bytes of text), and before writing when below the exact size;
# either way no file is left. Runs on a 64 KiB tmpfs in a private mount namespace (exit 77,
# skipped, where mounting is not allowed).
if [ "${DS_DSTOK_MOUNT_NS:-}" != 1 ]; then
  if [ "$(id -u)" != 0 ] || ! unshare -m true 2>/dev/null; then echo "SKIP: needs root and unshare -m"; exit 77; fi
  DS_DSTOK_MOUNT_NS=1 exec unshare -m --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/dstok_lib.sh" full_disk
mkdir "$T/small"
mount -t tmpfs -o size=64k tmpfs "$T/small" || { echo "SKIP: cannot mount a tmpfs"; exit 77; }
trap 'umount "$T/small"; rm -rf "$T"' EXIT
TOK=(--tokenizer "$T/gpt2")
"$PY" - "$T" <<'PYEOF'
import random, sys
random.seed(1)
# Plain words: about 3 bytes per token with the test vocabulary. Random letters: about 1.
open(sys.argv[1] + "/words.txt", "w").write("hello world, it's said\n" * 20000)
open(sys.argv[1] + "/letters.txt", "w").write("".join(random.choice("qxzjvk") for _ in range(60000)))
PYEOF
empty() { [ -z "$(ls -A "$T/small")" ] || fail "$1: files left: $(ls -A "$T/small")"; }

expect 1 "dstok: error: --output $T/small/w: the shards need 154356 bytes (estimated before encoding at one token per 6 bytes of text) but the file system of $T/small has 65536 bytes free" \
  encode "${TOK[@]}" --input "$T/words.txt" --output "$T/small/w"
empty "the estimate"
expect 1 "bytes (60000 tokens in 1 shard(s)) but the file system of $T/small has 65536 bytes free" \
  encode "${TOK[@]}" --input "$T/letters.txt" --output "$T/small/l"
empty "the exact size"
echo "hello" >"$T/short.txt"
"$DSTOK" encode "${TOK[@]}" --input "$T/short.txt" --output "$T/small/s" >/dev/null
[ "$(ls -A "$T/small")" = s_000000.bin ] || fail "a small encode there: $(ls -A "$T/small")"
echo "PASS"
