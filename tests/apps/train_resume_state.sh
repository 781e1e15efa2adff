#!/usr/bin/env bash
# The state tree of a checkpoint is not checksummed: train validates it before anything is
# applied. Values edited in place (h5py) -- negative or absurd steps, epochs, micro-batch
# counts, a zero loss scale -- give one error naming the field, before "loaded checkpoint";
# a checkpoint saved with another head count (same tensor shapes) is refused too. Resuming on
# other data than the checkpoint's warns, naming both.
source "$(dirname "$0")/lib.sh"

must_run 2 base --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2 --save_dir ck

# expect_refused NAME PATTERN DATASET VALUE: a copy of ck with DATASET (in model_states.h5)
# set to VALUE must be refused on resume, naming PATTERN, with nothing loaded.
expect_refused() {
  local name=$1 pattern=$2 dataset=$3 value=$4
  rm -rf "ck_$name"; cp -r ck "ck_$name"
  "$PY" - "ck_$name/global_step2/model_states.h5" "$dataset" "$value" <<'PYEOF'
import sys, h5py
path, ds, value = sys.argv[1:4]
with h5py.File(path, "r+") as f:
    f[ds][()] = float(value) if "." in value else int(value)
PYEOF
  if run_train 2 "$name" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 4 --load_dir "ck_$name"; then
    fail "$name: resumed from a checkpoint with $dataset = $value"
  fi
  grep -qF -- "$pattern" "$name.err" || { cat "$name.err"; fail "$name: error does not say '$pattern'"; }
  if grep -q 'loaded checkpoint' "$name.out"; then fail "$name: 'loaded checkpoint' printed before the error"; fi
  if grep -q 'vector' "$name.err"; then cat "$name.err"; fail "$name: an opaque std::vector error"; fi
  echo "ok: $name: $(grep -m1 'train: error: ' "$name.err")"
}

expect_refused global_steps "engine state 'global_steps' is -5; expected an integer in [0, " engine/global_steps -5
expect_refused micro_steps "engine state 'micro_steps' is -3" engine/micro_steps -3
expect_refused cur_scale "engine state 'loss_scaler.cur_scale' is 0; expected a finite number > 0" engine/loss_scaler/cur_scale 0.0
expect_refused step "client state 'step' is -1" client_state/step -1
expect_refused epoch "client state 'sampler.epoch' is -1" client_state/sampler/epoch -1
expect_refused sampler_step "client state 'sampler.step' is 1000000000000" client_state/sampler/step 1000000000000
expect_refused micro_batch "client state 'sampler.global_micro_batch' is 0" client_state/sampler/global_micro_batch 0
expect_refused micro_batch_neg "client state 'sampler.global_micro_batch' is -32" client_state/sampler/global_micro_batch -32

# Another head count: every tensor has the same shape, the model is still another one.
HEADS4=(--n_layer 1 --n_head 4 --n_embd 32 --block_size 16 --eval_iters 2 --sample_tokens 16)
if run_train 2 heads --config "$CONFIGS/default.json" "${HEADS4[@]}" --steps 4 --load_dir ck; then
  fail "heads: resumed a 2-head checkpoint into a 4-head model"
fi
grep -qF "was saved from the model 'gpt n_layer=1 n_head=2 n_embd=32" heads.err || { cat heads.err; fail "heads: no model error"; }
grep -qF "this run builds 'gpt n_layer=1 n_head=4 n_embd=32" heads.err || { cat heads.err; fail "heads: no model error"; }
if grep -q 'loaded checkpoint' heads.out; then fail "heads: 'loaded checkpoint' printed before the error"; fi
echo "ok: heads: $(grep -m1 'train: error: ' heads.err)"

# The untouched checkpoint still resumes.
must_run 2 resumed --config "$CONFIGS/default.json" "${TINY[@]}" --steps 3 --load_dir ck
grep -q 'resumed from ck/global_step2 at step 2' resumed.out || fail "no resume from ck/global_step2"
if grep -q 'was trained on' resumed.err; then cat resumed.err; fail "a data warning on the same data"; fi

# Other data than the checkpoint was trained on: the resume goes on, with a warning naming both.
"$PY" -c "import random; random.seed(3); open('other.txt', 'w').write(''.join(random.choice('abcdefgh \n') for _ in range(20000)))"
must_run 2 otherdata --config "$CONFIGS/default.json" "${TINY[@]}" --steps 3 --load_dir ck --data other.txt
grep -qF "train: warning: checkpoint ck/global_step2 was trained on 'the embedded corpus' (" otherdata.err ||
  { cat otherdata.err; fail "otherdata: no warning naming the checkpoint's data"; }
grep -qF "; this run trains on 'other.txt' (20000 tokens, fnv1a64:" otherdata.err ||
  { cat otherdata.err; fail "otherdata: the warning does not name this run's data"; }
echo "ok: otherdata: $(grep -m1 'train: warning: ' otherdata.err)"
echo "PASS"
