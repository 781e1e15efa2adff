#!/usr/bin/env bash
# nanoGPT / llm.c token data: train on a glob of llm.c shards written here (the loss falls,
# the vocabulary is the largest id + 1), resume across shards repeats the unbroken run's
# losses, a raw uint32 file with --data_dtype, and the errors (one line naming file and offset).
source "$(dirname "$0")/lib.sh"

# Three llm.c shards (version 1, uint16), vocab 300: mostly a fixed successor per token, so
# a bigram model learns it. Also the byte offset of the first token >= 256 in shard 0.
mkdir shards
"$PY" - <<'PYEOF'
import random, struct
random.seed(11)
first_big = None
for s in range(3):
    toks, t = [], random.randrange(300)
    for i in range(3000 + 500 * s):
        toks.append(t)
        t = (t * 7 + 3) % 300 if random.random() < 0.9 else random.randrange(300)
    if s == 0:
        first_big = 1024 + 2 * next(i for i, x in enumerate(toks) if x >= 256)
        open("first_big.txt", "w").write(f"{toks[(first_big - 1024) // 2]} {first_big}\n")
    toks[-1] = 299 if s == 2 else toks[-1]  # the largest id is in the set
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, len(toks)
    with open(f"shards/train_{s:06d}.bin", "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack(f"<{len(toks)}H", *toks))
# A raw uint32 file (no header), the same kind of tokens.
with open("raw32.tok", "wb") as f:
    f.write(struct.pack("<4000I", *[(i * 7 + 3) % 300 for i in range(4000)]))
PYEOF
write_config flat.json "$CONFIGS/default.json" '
del c["scheduler"]; c["optimizer"]["params"]["lr"] = 1e-2'

must_run 2 run --config flat.json "${TINY[@]}" --data 'shards/train_*.bin' --steps 40 --loss_csv loss.csv
"$PY" - loss.csv <<'PYEOF'
import csv, math, sys
loss = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
assert len(loss) == 40 and all(math.isfinite(x) for x in loss), loss
first, last = sum(loss[:3]) / 3, sum(loss[-3:]) / 3
print(f"first 3 steps {first:.4f}, last 3 steps {last:.4f}")
assert first > 5.0, f"initial loss {first} should be near ln(300)=5.70"
assert last < first - 1.0, f"loss did not fall: {first} -> {last}"
PYEOF
grep -q 'vocab_size=300' run.out || fail "the model's vocab is not the shards' largest id + 1 (300)"
grep -q '^\[train\] token data: 3 llm.c shards, uint16 tokens, memory-mapped' run.out || fail "no token data line"
grep -q '^\[train\] no text sample' run.out || fail "no 'no text sample' line"
echo "ok: llm.c shards train"

# Resume across shards: steps 5-8 from the step-4 checkpoint repeat the unbroken run.
must_run 2 full --config flat.json "${TINY[@]}" --data 'shards/train_*.bin' --steps 8 --save_dir ckpt \
  --save_interval 4 --loss_csv full.csv
must_run 2 resumed --config flat.json "${TINY[@]}" --data 'shards/train_*.bin' --steps 8 --load_dir ckpt \
  --ckpt_id global_step4 --loss_csv resumed.csv
compare_losses resumed.csv full.csv 1e-6 5
echo "ok: resume"

# A headerless uint32 file (any name) with --data_dtype uint32.
must_run 1 raw32 --config flat.json "${TINY[@]}" --data raw32.tok --data_dtype uint32 --steps 2
grep -q '^\[train\] token data: 1 raw token file, uint32 tokens' raw32.out || fail "raw uint32: no token data line"
echo "ok: raw uint32"

# expect_error NAME 'message' args...: exits non-zero with one error line containing message.
expect_error() {
  local name=$1 msg=$2; shift 2
  if run_train 1 "$name" --config flat.json "${TINY[@]}" --steps 1 "$@"; then fail "$name: exited 0"; fi
  grep -qF -- "train: error: $msg" "$name.err" || { cat "$name.err"; fail "$name: no error '$msg'"; }
  [ "$(grep -c 'train: error' "$name.err")" = 1 ] || { cat "$name.err"; fail "$name: not one error line"; }
}
expect_error nomatch "token data 'shards/val_*.bin': the pattern matches no file" --data 'shards/val_*.bin'
read -r big off < first_big.txt
write_config v256.json flat.json 'c["model"]["vocab_size"] = 256'
if run_train 1 vocab --config v256.json "${TINY[@]}" --steps 1 --data 'shards/train_*.bin'; then fail "vocab: exited 0"; fi
grep -qF "train: error: token file 'shards/train_000000.bin': token id $big at byte offset $off is >= model.vocab_size 256" vocab.err \
  || { cat vocab.err; fail "vocab: no error naming the token's file and offset"; }
# Without model.vocab_size the data sizes the model: a corrupt id of 4e9 is an error naming
# it (it was a 1 TB allocation naming neither the id nor the file).
"$PY" -c 'import struct; open("huge_id.bin", "wb").write(struct.pack("<3i", 20240520, 2, 3) + bytes(1012) + struct.pack("<3I", 1, 4000000000, 2))'
expect_error huge_id "token file 'huge_id.bin': token id 4000000000 at byte offset 1028 is >= the largest vocab size taken from the data (set model.vocab_size for more): 2097152" \
  --data huge_id.bin
printf 'abc' > odd.bin
expect_error odd "token file 'odd.bin': odd-sized raw file: 3 bytes" --data odd.bin
mkdir mixed && cp shards/train_000000.bin mixed/a.bin && printf 'xxxxyyyy' > mixed/b.bin
expect_error magic "token file 'mixed/b.bin': wrong magic" --data 'mixed/*.bin'
head -c 2000 shards/train_000001.bin > short.bin
expect_error truncated "token file 'short.bin': truncated: the header's token count 3500 (byte offset 8)" --data short.bin
echo "PASS"
