#!/bin/bash
# dstok encode's output: shards appear only complete (hidden temporary files renamed into
# place), so a reader holding the old files keeps their content and a failed write leaves no
# file; existing shards of the prefix are an error unless --force, which also removes the
# prefix's higher-numbered shards; a symlink at a shard name is refused, and with --force
# replaced, never written through. Then decode reads every format train --data reads, and
# encode falls back to fewer threads when threads cannot start.
source "$(dirname "$0")/dstok_lib.sh" output
for i in $(seq 1 3000); do echo "line $i says hello world"; done >"$T/long.txt"
echo "hello" >"$T/short.txt"
TOK=(--tokenizer "$T/gpt2")
no_temporaries() { [ -z "$(ls -A "$T" | grep '^\.')" ] || fail "$1: temporary files left: $(ls -A "$T" | grep '^\.')"; }

"$DSTOK" encode "${TOK[@]}" --input "$T/long.txt" --output "$T/p" --shard_tokens 5000 >/dev/null
n=$(ls "$T"/p_*.bin | wc -l)
[ "$n" -ge 3 ] || fail "long.txt gave $n shards, want 3 or more"
cp "$T/p_000000.bin" "$T/old.bin"

# Existing shards: an error naming one, nothing written.
expect 1 "dstok: error: --output $T/p: $T/p_000000.bin already exists ($n shards of this prefix exist): give --force to replace the prefix's shards, or another --output" \
  encode "${TOK[@]}" --input "$T/short.txt" --output "$T/p"
cmp -s "$T/p_000000.bin" "$T/old.bin" || fail "a refused encode changed p_000000.bin"

# A failed write (the file size limit; a full disk alike) leaves the old shards and no file.
rc=0
(trap '' XFSZ; ulimit -f 2; "$DSTOK" encode "${TOK[@]}" --input "$T/long.txt" --output "$T/p" --force) \
  >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 1 ] || fail "encode over the file size limit: exit $rc: $(cat "$T/err")"
grep -qF "dstok: error: writing $T/p_000000.bin failed: File too large" "$T/err" || fail "file size limit: $(cat "$T/err")"
[ "$(ls "$T"/p_*.bin | wc -l)" = "$n" ] && cmp -s "$T/p_000000.bin" "$T/old.bin" || fail "a failed encode changed the shards"
no_temporaries "a failed encode"

# --force: the new shard replaces the old ones and the higher-numbered ones go; a reader's
# file (a hard link stands for a running job's mapping) keeps the old bytes.
ln "$T/p_000000.bin" "$T/reader.bin"
"$DSTOK" encode "${TOK[@]}" --input "$T/short.txt" --output "$T/p" --force >/dev/null
[ "$(ls "$T"/p_*.bin)" = "$T/p_000000.bin" ] || fail "--force left older shards: $(ls "$T"/p_*.bin)"
cmp -s "$T/reader.bin" "$T/old.bin" || fail "the shard changed under its reader"
"$DSTOK" decode "${TOK[@]}" --input "$T/p_000000.bin" | cmp -s - "$T/short.txt" || fail "decode after --force"
no_temporaries "encode --force"

# A symlink at a shard name (even a dangling one) is refused; --force replaces the link.
echo "precious" >"$T/target.txt"
ln -s "$T/target.txt" "$T/s_000000.bin"
ln -s "$T/nowhere" "$T/s_000001.bin"
expect 1 "dstok: error: --output $T/s: $T/s_000000.bin (a symbolic link) already exists (2 shards of this prefix exist)" \
  encode "${TOK[@]}" --input "$T/short.txt" --output "$T/s"
"$DSTOK" encode "${TOK[@]}" --input "$T/short.txt" --output "$T/s" --force >/dev/null
[ "$(cat "$T/target.txt")" = precious ] || fail "encode wrote through the symlink"
[ -f "$T/s_000000.bin" ] && [ ! -L "$T/s_000000.bin" ] && [ ! -e "$T/s_000001.bin" ] && [ ! -L "$T/s_000001.bin" ] ||
  fail "--force did not replace the symlinks: $(ls -l "$T"/s_*)"
mkdir "$T/d_000000.bin"
expect 1 "dstok: error: --output $T/d: $T/d_000000.bin is a directory, not a shard: move it away" \
  encode "${TOK[@]}" --input "$T/short.txt" --output "$T/d" --force

# decode reads what train --data reads: Llama 3 shards (magic 20240801, version 7, uint32)
# and raw token files with --data_dtype.
"$PY" - "$T/p_000000.bin" "$T" <<'PYEOF'
import struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<i", b[8:12])[0]
ids = struct.unpack(f"<{n}H", b[1024:])
open(sys.argv[2] + "/llama3.bin", "wb").write(struct.pack("<3i", 20240801, 7, n) + bytes(1012) + struct.pack(f"<{n}I", *ids))
open(sys.argv[2] + "/raw16.tok", "wb").write(struct.pack(f"<{n}H", *ids))
open(sys.argv[2] + "/raw32.tok", "wb").write(struct.pack(f"<{n}I", *ids))
PYEOF
for input in "llama3.bin" "raw16.tok --data_dtype uint16" "raw32.tok --data_dtype uint32"; do
  # shellcheck disable=SC2086
  "$DSTOK" decode "${TOK[@]}" --input $T/$input | cmp -s - "$T/short.txt" || fail "decode --input $input"
done

# Threads that cannot start (4 GiB stacks under a 6 GiB address-space limit): a warning and
# the same shard from fewer threads, not std::terminate.
"$DSTOK" encode "${TOK[@]}" --input "$T/long.txt" --output "$T/one" --threads 1 >/dev/null
rc=0
(ulimit -s 4194304; ulimit -v 6291456; "$DSTOK" encode "${TOK[@]}" --input "$T/long.txt" --output "$T/lim" --threads 64) \
  >/dev/null 2>"$T/err" || rc=$?
[ "$rc" = 0 ] || fail "encode under a thread limit: exit $rc: $(cat "$T/err")"
grep -q "warning: could not start thread [0-9]* of 64 (.*): running the other" "$T/err" ||
  fail "no warning under the thread limit: $(cat "$T/err")"
cmp -s "$T/one_000000.bin" "$T/lim_000000.bin" || fail "the shard under the thread limit differs from 1 thread"
echo "PASS"
