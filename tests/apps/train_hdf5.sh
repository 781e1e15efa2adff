#!/usr/bin/env bash
# HDF5 arrays as training data: scikit-learn's bundled digits (1797 8x8 images, 10 classes),
# written with h5py, trained by the built-in MLP (--model mlp reads the features as they are).
# The loss falls on 1 and 2 ranks; 2 ranks equal 1 with the same global batch; a resumed run
# repeats the unbroken one; errors name the file and the arrays.
source "$(dirname "$0")/lib.sh"

"$PY" - <<'PYEOF'
import h5py, numpy as np
from sklearn.datasets import load_digits
d = load_digits()
with h5py.File("digits.h5", "w") as f:
    f["images"] = (d.images / 16.0).astype(np.float32)  # (1797, 8, 8)
    f["labels"] = d.target.astype(np.int64)             # (1797,)
    f["pixels"] = d.images.astype(np.uint8)             # integer inputs, converted to float
    f["regress"] = d.images[:, :2, 0].astype(np.float32)  # float targets: not for the classifier
with h5py.File("small.h5", "w") as f:
    f["inputs"] = np.zeros((20, 4), np.float32)
    f["targets"] = np.arange(20) % 3
PYEOF

# A fixed learning rate (no scheduler): a resumed run must see the same one.
write_config mlp.json "$CONFIGS/default.json" '
c["model"] = {"type": "mlp", "n_layer": 1, "n_embd": 32}
del c["scheduler"]
c["optimizer"]["params"]["lr"] = 0.01'
ARRAYS=(--data digits.h5 --data_inputs images --data_targets labels --eval_iters 4)

# Loss falls, on 1 and 2 ranks (train batch 16 and 32: the config's micro-batch of 16).
for np in 1 2; do
  must_run $np falls$np --config mlp.json "${ARRAYS[@]}" --steps 40 --loss_csv falls$np.csv
  "$PY" - falls$np.csv <<'PYEOF'
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
loss = [float(r["loss"]) for r in rows]
assert len(loss) == 40 and all(math.isfinite(x) for x in loss), loss
first, last = sum(loss[:3]) / 3, sum(loss[-3:]) / 3
val = [float(r["val_loss"]) for r in rows if r["val_loss"]]
print(f"{sys.argv[1]}: first 3 steps {first:.4f}, last 3 steps {last:.4f}, validation {val[0]:.4f} -> {val[-1]:.4f}")
assert first > 1.9, f"initial loss {first} should be near ln(10) = 2.30"
assert last < 0.6 * first, f"loss did not fall: {first} -> {last}"
assert val[-1] < 0.6 * val[0], f"validation loss did not fall: {val}"
PYEOF
done
grep -q "\[train\] model: mlp n_layer=1 n_embd=32 in_features=64 vocab_size=10" falls2.out ||
  fail "model line: $(grep '\[train\] model' falls2.out)"
grep -q "\[train\] data: digits.h5: 1617 training / 180 validation samples" falls2.out ||
  fail "data line: $(grep '\[train\] data' falls2.out)"
grep -q "\[train\] arrays: inputs 'images' float32 \[8, 8\], targets 'labels' int64 (one per sample)" falls2.out ||
  fail "no arrays line"

# The same global batch of 16 on 2 ranks as the 1-rank run above (micro-batch 16): the same
# samples per step (one seeded permutation strided across the ranks); only the order of float
# sums differs. 30 steps stay inside the first epoch (the padded tail differs between world sizes).
write_config tb16.json mlp.json '
del c["train_micro_batch_size_per_gpu"]; del c["gradient_accumulation_steps"]
c["train_batch_size"] = 16'
must_run 2 eq2 --config tb16.json "${ARRAYS[@]}" --steps 30 --loss_csv eq2.csv
compare_losses eq2.csv falls1.csv 1e-5

# Resume: steps 21-40 from the step-20 checkpoint repeat the unbroken run's (2 ranks, integer
# inputs converted to float; half the samples held out, so an epoch is 29 steps and the
# resumed run crosses into the second, reshuffled one).
HALF=(--data digits.h5 --data_inputs pixels --data_targets labels --val_fraction 0.5 --eval_iters 2)
must_run 2 full --config mlp.json "${HALF[@]}" --steps 40 --save_dir ck --save_interval 20 --loss_csv full.csv
grep -q "29 optimizer steps per epoch" full.out || fail "epoch: $(grep '\[train\] data' full.out)"
must_run 2 resumed --config mlp.json "${HALF[@]}" --steps 40 --load_dir ck --ckpt_id global_step20 --loss_csv resumed.csv \
  --progress bar
compare_losses resumed.csv full.csv 1e-6 21
grep -q 'resumed from' resumed.out || fail "no resume message"
grep -q '[0-9] samples/s |' resumed.out || fail "the progress bar does not count samples"
# Resumed on other arrays of the file: a warning naming both, counted in samples.
must_run 2 other --config mlp.json "${HALF[@]/pixels/images}" --steps 21 --load_dir ck --ckpt_id global_step20
grep -q "train: warning: checkpoint ck/global_step20 was trained on 'digits.h5' (1797 samples, fnv1a64:" other.err ||
  fail "no data warning in samples: $(cat other.err)"

# Errors: one line naming the file and the arrays, exit non-zero.
expect_error() {
  local name=$1 pattern=$2; shift 2
  if run_train 2 "$name" "$@"; then fail "$name: train succeeded"; fi
  grep -qF -- "$pattern" "$name.err" || { cat "$name.err"; fail "$name: error does not say '$pattern'"; }
  echo "ok: $name: $(grep -m1 'train: error: ' "$name.err")"
}
expect_error no_dataset "HDF5 file digits.h5 has no dataset 'inputs' (the inputs array)" \
  --config mlp.json --data digits.h5 --steps 2
expect_error float_targets "--model mlp is a classifier: it needs one integer class id per sample" \
  --config mlp.json --data digits.h5 --data_inputs images --data_targets regress --steps 2
expect_error gpt "--model gpt reads tokens, but --data digits.h5 holds arrays" \
  --config mlp.json --model gpt "${ARRAYS[@]}" --steps 2
expect_error few "--data small.h5: 18 training samples (of 20; --val_fraction holds out 2) are fewer than one micro-batch of 16 on each of 2 rank(s)" \
  --config mlp.json --data small.h5 --steps 2
expect_error not_hdf5 "--data_inputs and --data_targets name arrays of an HDF5 file; --data mlp.json is not one" \
  --config mlp.json --data mlp.json --data_inputs x --steps 2
echo "PASS"
