#!/usr/bin/env bash
# The Llama-style decoder through the train app: configs/llama_tiny.json (model.type "llama",
# grouped-query n_kv_head) with a tiny shape, on 1 and 2 ranks: the loss falls from near
# ln 256, the model line names the shape, a sample is generated; a checkpoint resumes exactly.
# Then --model llama on the default config, and the shape errors as one line naming the flag;
# rope_theta, rms_norm_eps and tie_embeddings from the config and the flags.
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
# The Llama settings train did not take before: model.rope_theta / rms_norm_eps /
# tie_embeddings in the config, or the flags, reach the model (the same losses both ways,
# other losses than the defaults'); tied means no lm_head.weight; a resume with another
# rope_theta is refused; bad values are one error line naming the key or flag.
SHAPE=(--n_layer 2 --n_head 4 --n_kv_head 2 --n_embd 32 --block_size 16 --eval_iters 0 --sample_tokens 0)
LL=(--config "$CONFIGS/llama_tiny.json" "${SHAPE[@]}" --steps 4)
must_run 1 base "${LL[@]}" --loss_csv base.csv
write_config set.json "$CONFIGS/llama_tiny.json" 'c["model"].update(rope_theta=500000, rms_norm_eps=1e-6, tie_embeddings=True)'
must_run 1 keys --config set.json "${SHAPE[@]}" --steps 4 --loss_csv keys.csv \
  --save_dir tied
must_run 1 flags "${LL[@]}" --rope_theta 500000 --rms_norm_eps 1e-6 --tie_embeddings true --loss_csv flags.csv
grep -q 'vocab_size=256 rope_theta=500000 rms_norm_eps=1e-06 tie_embeddings=true (' keys.out || { cat keys.out; fail "no settings in the model line"; }
compare_losses flags.csv keys.csv 0
params() { sed -n 's/.*model: llama .* (\([0-9]*\) parameters).*/\1/p' "$1"; }
[ "$(params keys.out)" = "$(( $(params base.out) - 256 * 32 ))" ] || fail "tied: $(params keys.out) parameters, untied $(params base.out)"
must_run 1 theta "${LL[@]}" --rope_theta 500000 --loss_csv theta.csv
if compare_losses theta.csv base.csv 0 >/dev/null 2>&1; then fail "--rope_theta 500000 gave the default's losses"; fi
must_run 1 eps "${LL[@]}" --rms_norm_eps 0.5 --loss_csv eps.csv
if compare_losses eps.csv base.csv 0 >/dev/null 2>&1; then fail "--rms_norm_eps 0.5 gave the default's losses"; fi
"$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32" tied tied.safetensors --format safetensors --hf_names >export.out ||
  fail "export of the tied model: $(cat export.out)"
grep -q "wrote 20 fp32 tensors" export.out || fail "tied export: $(cat export.out)"
if grep -aq "lm_head.weight" tied.safetensors; then fail "the tied export has an lm_head.weight"; fi
if run_train 1 retheta --config set.json "${SHAPE[@]}" --steps 6 --load_dir tied \
  --rope_theta 10000; then fail "a resume with another rope_theta was accepted"; fi
grep -q "was saved from the model 'llama .* rope_theta=500000 rms_norm_eps=1e-06 tie_embeddings=true'" retheta.err ||
  { cat retheta.err; fail "no resume error naming rope_theta"; }

expect_error() {  # expect_error NAME 'error text' train args...
  local name=$1 want=$2; shift 2
  if run_train 1 "$name" "$@"; then fail "$name: accepted"; fi
  grep -qF -- "$want" "$name.err" || { cat "$name.err"; fail "$name: no '$want'"; }
}
expect_error theta0 "train: error: --rope_theta must be a positive number, got 0" "${LL[@]}" --rope_theta 0
expect_error tieyes "--tie_embeddings: yes not in {true,false}" "${LL[@]}" --tie_embeddings yes
write_config badeps.json "$CONFIGS/llama_tiny.json" 'c["model"]["rms_norm_eps"] = "1e-6"'
expect_error badeps "train: error: badeps.json: model.rms_norm_eps must be a positive number, got \"1e-6\"" \
  --config badeps.json --steps 1
write_config badtie.json "$CONFIGS/llama_tiny.json" 'c["model"]["tie_embeddings"] = "true"'
expect_error badtie "train: error: badtie.json: model.tie_embeddings must be true or false, got \"true\"" \
  --config badtie.json --steps 1
expect_error gpttheta "train: error: rope_theta is a llama setting; --model gpt does not take it" \
  --config "$CONFIGS/default.json" --rope_theta 500000 --steps 1
echo "PASS"
