#!/bin/bash
# dstok against an independent Python implementation of GPT-2's encoder (bpe_reference.py):
# the same ids for every test text from both tokenizer forms (vocab.json + merges.txt and
# tokenizer.json), the same shards for 1, 2, 3 and 7 threads, shards split at --shard_tokens,
# decode giving back the exact bytes (random bytes, invalid UTF-8, included), and uint32
# (version 2) shards when the ids pass 65535.
source "$(dirname "$0")/dstok_lib.sh" reference
mkdir "$T/out"

# ids OUT_PREFIX: the tokens of all OUT_PREFIX_*.bin shards, in order, as JSON.
check_ids() {  # check_ids PREFIX 'python expression for the expected list' WHAT
  "$PY" - "$1" "$T/expected.json" "$2" "$3" <<'PYEOF' || exit 1
import glob, json, struct, sys
prefix, expected_file, expr, what = sys.argv[1:5]
e = json.load(open(expected_file))
want = eval(expr)
ids = []
for f in sorted(glob.glob(prefix + "_*.bin")):
    b = open(f, "rb").read()
    magic, version, n = struct.unpack("<3i", b[:12])
    assert magic == 20240520 and version == 1, (f, magic, version)
    assert len(b) == 1024 + 2 * n, (f, len(b), n)
    ids += struct.unpack(f"<{n}H", b[1024:])
if list(ids) != want:
    i = next((k for k, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))
    print(f"FAIL: {what}: ids differ from the reference at {i}: got {list(ids[i:i+8])} want {want[i:i+8]} "
          f"({len(ids)} vs {len(want)} ids)")
    sys.exit(1)
PYEOF
}

for tok in "$T/gpt2" "$T/tokenizer.json"; do
  for i in 0 1 2 3 4 5 6 7 8 9; do
    out=$T/out/t$i
    rm -f "$out"_*.bin
    "$DSTOK" encode --tokenizer "$tok" --input "$T/text_$i.txt" --output "$out" --shard_tokens 7 --threads 2 >/dev/null
    check_ids "$out" "e['ids'][$i]" "text_$i.txt with $tok"
    "$DSTOK" decode --tokenizer "$tok" $(ls "$out"_*.bin | sed 's/^/--input /') >"$T/dec"
    cmp -s "$T/dec" "$T/text_$i.txt" || fail "decode of text_$i.txt ($tok) is not the text"
  done
done

# The long text: reference ids with 1 thread, and byte-identical shards for other counts.
"$DSTOK" encode --tokenizer "$T/gpt2" --input "$T/big.txt" --output "$T/out/big1" --threads 1 --shard_tokens 40000 \
  >"$T/log"
grep -qE "^dstok: [0-9]+ tokens from [0-9]+ bytes in 3 shard\(s\), vocab size [0-9]+, uint16 tokens \(version 1\)$" \
  "$T/log" || fail "encode summary: $(cat "$T/log")"
check_ids "$T/out/big1" "e['big']" "big.txt, 1 thread"
for th in 2 3 7; do
  "$DSTOK" encode --tokenizer "$T/gpt2" --input "$T/big.txt" --output "$T/out/big$th" --threads $th \
    --shard_tokens 40000 >/dev/null
  for k in 000000 000001 000002; do
    cmp -s "$T/out/big1_$k.bin" "$T/out/big${th}_$k.bin" || fail "big.txt: shard $k with $th threads differs from 1 thread"
  done
done
"$DSTOK" decode --tokenizer "$T/gpt2" --input "$T/out/big3_000000.bin" --input "$T/out/big3_000001.bin" \
  --input "$T/out/big3_000002.bin" >"$T/dec"
cmp -s "$T/dec" "$T/big.txt" || fail "decode of big.txt is not the text"

# Random bytes round-trip exactly, whatever the thread count.
for th in 1 4; do
  "$DSTOK" encode --tokenizer "$T/tokenizer.json" --input "$T/binary.bin" --output "$T/out/bin$th" --threads $th >/dev/null
  "$DSTOK" decode --tokenizer "$T/tokenizer.json" --input "$T/out/bin${th}_000000.bin" >"$T/dec"
  cmp -s "$T/dec" "$T/binary.bin" || fail "random bytes do not round-trip ($th threads)"
done
cmp -s "$T/out/bin1_000000.bin" "$T/out/bin4_000000.bin" || fail "random bytes: 4 threads differ from 1"

# Ids above 65535: version 2, uint32 tokens; --eot starts each input with <|endoftext|>.
"$DSTOK" encode --tokenizer "$T/big_vocab.json" --input "$T/text_0.txt" --input "$T/text_1.txt" \
  --output "$T/out/v2" --eot >"$T/log"
grep -q "vocab size 70001, uint32 tokens (version 2)$" "$T/log" || fail "v2 summary: $(cat "$T/log")"
"$PY" - "$T/out/v2_000000.bin" "$T/expected.json" <<'PYEOF' || exit 1
import json, struct, sys
b = open(sys.argv[1], "rb").read()
e = json.load(open(sys.argv[2]))
magic, version, n = struct.unpack("<3i", b[:12])
want = [70000] + e["ids"][0] + [70000] + e["ids"][1]
got = list(struct.unpack(f"<{n}I", b[1024:]))
if (magic, version, len(b)) != (20240520, 2, 1024 + 4 * n) or got != want:
    print(f"FAIL: version 2 shard: magic {magic} version {version} size {len(b)} n {n}; got {got[:5]} want {want[:5]}")
    sys.exit(1)
PYEOF
"$DSTOK" decode --tokenizer "$T/big_vocab.json" --input "$T/out/v2_000000.bin" >"$T/dec"
printf '<|endoftext|>%s<|endoftext|>%s' "$(cat "$T/text_0.txt")" "$(cat "$T/text_1.txt")" | cmp -s - "$T/dec" ||
  fail "decode of the version 2 shard: $(head -c 200 "$T/dec")"
echo "PASS"
