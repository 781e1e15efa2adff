#!/usr/bin/env bash
# The Llama-style decoder through the train app: configs/llama_tiny.json (model.type "llama",
# grouped-query n_kv_head) with a tiny shape, on 1 and 2 ranks: the loss falls from near
# ln 256, the model line names the shape, a sample is generated; a checkpoint resumes exactly.
# Then --model llama on the default config, and the shape errors as one line naming the flag.
source "$(dirname "$0")/lib.sh"

SMALL=(--n_layer 2 --n_head 4 --n_kv_head 2 --n_embd 32 --block_size 16 --eval_iters 2 --sample_tokens 16)
for np in 1 2; do
  must_run $np r$np --config "$CONFIGS/llama_tiny.json" "${SMALL[@]}" --steps 40 --eval_interval 20 \
    --loss_csv loss$np.csv
  "$PY" - loss$np.csv <<'PYEOF'
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 40, f"expected 40 rows, got {len(rows)}"
loss = [float(r["loss"]) for r in rows]
assert all(math.isfinite(x) for x in loss), loss
first, last = sum(loss[:3]) / 3, sum(loss[-3:]) / 3
print(f"{sys.argv[1]}: first 3 steps {first:.4f}, last 3 steps {last:.4f}")
assert first > 4.5, f"initial loss {first} should be near ln(256)=5.55"
assert last < first - 1.0, f"loss did not fall: {first} -> {last}"
PYEOF
  grep -q 'model: llama n_layer=2 n_head=4 n_kv_head=2 n_embd=32 intermediate_size=86 block_size=16 vocab_size=256' r$np.out \
    || { cat r$np.out; fail "no llama model line on $np rank(s)"; }
  grep -q '^\[train\] sample' r$np.out || fail "no generated sample on $np rank(s)"
  grep -q '^\[train\] done: 40 steps' r$np.out || fail "no summary line on $np rank(s)"
done

# Checkpoints: a run resumed from step 4 repeats the unbroken run's steps 5-8.
must_run 2 full --config "$CONFIGS/llama_tiny.json" "${SMALL[@]}" --steps 8 --save_dir ckpt --save_interval 4 \
  --loss_csv full.csv
must_run 2 resumed --config "$CONFIGS/llama_tiny.json" "${SMALL[@]}" --steps 8 --load_dir ckpt --ckpt_id global_step4 \
  --loss_csv resumed.csv
grep -q 'resumed from' resumed.out || fail "no resume message"
compare_losses resumed.csv full.csv 1e-6 5

# --model llama over the GPT config's model section; n_kv_head defaults to n_head.
must_run 1 flag --config "$CONFIGS/default.json" --model llama --n_layer 1 --n_head 2 --n_embd 32 --block_size 16 \
  --intermediate_size 40 --eval_iters 1 --sample_tokens 0 --steps 3
grep -q 'model: llama n_layer=1 n_head=2 n_kv_head=2 n_embd=32 intermediate_size=40' flag.out \
  || { cat flag.out; fail "--model llama: wrong model line"; }

# Shapes it cannot take: one error line naming the setting, non-zero exit.
if run_train 1 bad --config "$CONFIGS/llama_tiny.json" --n_kv_head 3 --steps 1; then fail "n_kv_head 3 of 4 heads accepted"; fi
grep -q 'n_head (4) must be divisible by n_kv_head (3); set --n_kv_head or model.n_kv_head' bad.err \
  || { cat bad.err; fail "no n_kv_head error"; }
if run_train 1 odd --config "$CONFIGS/llama_tiny.json" --n_head 8 --n_kv_head 8 --n_embd 24 --steps 1; then fail "odd head dim accepted"; fi
grep -q 'head dim n_embd / n_head (3) must be even' odd.err || { cat odd.err; fail "no head dim error"; }
if run_train 1 gpt --config "$CONFIGS/default.json" --n_kv_head 2 --steps 1; then fail "--n_kv_head accepted for the GPT"; fi
grep -q 'n_kv_head and intermediate_size are llama settings; --model gpt takes neither' gpt.err \
  || { cat gpt.err; fail "no gpt/n_kv_head error"; }
echo "PASS"
