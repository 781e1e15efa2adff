#!/usr/bin/env bash
# The other ways in: --data with a text file and --epochs, --data with a token file (vocab
# from its header), --model mlp, and DeepSpeed's command-line forms.
source "$(dirname "$0")/lib.sh"

# A text file: --epochs 1 runs exactly one pass (steps per epoch from the sampler).
"$PY" - <<'PYEOF'
import random
random.seed(3)
words = "the quick brown fox jumps over a lazy dog while seven wizards box".split()
open("text.txt", "w").write(" ".join(random.choice(words) for _ in range(6000)))
PYEOF
must_run 2 text --config "$CONFIGS/default.json" "${TINY[@]}" --data text.txt --epochs 1 --loss_csv text.csv
per_epoch=$(sed -nE 's/.* ([0-9]+) optimizer steps per epoch.*/\1/p' text.out)
[ -n "$per_epoch" ] || fail "no 'optimizer steps per epoch' line"
rows=$(($(wc -l < text.csv) - 1))
[ "$rows" = "$per_epoch" ] || fail "--epochs 1 ran $rows steps, expected $per_epoch"
grep -q 'data: text.txt' text.out || fail "the data line does not name text.txt"
echo "ok: text file, --epochs 1 = $rows steps"

# A token file (DSTOKENS v1, uint16 tokens, vocab 300): the model takes the file's vocab.
"$PY" - <<'PYEOF'
import random, struct
random.seed(5)
toks = [random.randrange(300) if i % 3 else 7 for i in range(20000)]
with open("tokens.bin", "wb") as f:
    f.write(b"DSTOKENS" + struct.pack("<IIQII", 1, 2, len(toks), 300, 0))
    f.write(struct.pack(f"<{len(toks)}H", *toks))
PYEOF
must_run 2 tok --config "$CONFIGS/default.json" "${TINY[@]}" --data tokens.bin --steps 3 --loss_csv tok.csv
grep -q 'vocab_size=300' tok.out || fail "token file: model vocab is not the file's 300"
echo "ok: token file"

# A corrupt token file gets a clear error naming it.
printf 'DSTOKENS\001\000\000\000' > bad.bin
if run_train 1 badtok --config "$CONFIGS/default.json" "${TINY[@]}" --data bad.bin --steps 1; then
  fail "corrupt token file: exited 0"
fi
grep -q 'train: error: .*bad.bin' badtok.err || { cat badtok.err; fail "corrupt token file: no error naming bad.bin"; }
echo "ok: corrupt token file refused"

# The MLP: trains, its loss falls from ln 256 (constant lr 1e-2: no warm-up in a short run).
write_config mlp.json "$CONFIGS/default.json" '
del c["scheduler"]; c["optimizer"]["params"]["lr"] = 1e-2'
must_run 2 mlp --config mlp.json --model mlp --n_layer 1 --n_embd 32 --block_size 4 \
  --steps 30 --eval_iters 2 --loss_csv mlp.csv
"$PY" - mlp.csv <<'PYEOF'
import csv, sys
loss = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
assert len(loss) == 30 and loss[-1] < loss[0] - 0.5, loss
PYEOF
grep -q 'model: mlp' mlp.out || fail "no mlp model line"
echo "ok: mlp"

# DeepSpeed's forms: --deepspeed --deepspeed_config FILE --local_rank=N (matching the MPI local rank).
must_run 1 dsflags --deepspeed --deepspeed_config "$CONFIGS/default.json" --local_rank=0 "${TINY[@]}" --steps 2
if run_train 1 badlocal --deepspeed_config "$CONFIGS/default.json" --local_rank=1 "${TINY[@]}" --steps 2; then
  fail "--local_rank=1 on local rank 0: exited 0"
fi
grep -q 'train: error: .*local_rank' badlocal.err || { cat badlocal.err; fail "--local_rank mismatch: no clear error"; }
echo "ok: DeepSpeed flags"
echo "PASS"
