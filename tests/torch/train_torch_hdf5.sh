#!/usr/bin/env bash
# A TorchScript CNN on HDF5 arrays: scikit-learn's bundled digits (8x8 images, 10 classes)
# written with h5py, trained by train --model torchscript:digits_cnn.pt on 2 ranks. The loss
# falls; a run saved at step 20 and resumed repeats the unbroken run's losses exactly; the
# checkpoint converts (ds_to_fp32) to the module's own parameter names.
source "$DS_SOURCE_DIR/tests/apps/lib.sh"
"$PY" "$DS_SOURCE_DIR/tests/torch/make_models.py" "$WORK/models"
"$PY" - <<'PYEOF'
import h5py, numpy as np
from sklearn.datasets import load_digits
d = load_digits()
with h5py.File("digits.h5", "w") as f:
    f["images"] = (d.images / 16.0).astype(np.float32)  # (1797, 8, 8)
    f["labels"] = d.target.astype(np.int64)
PYEOF
write_config cnn.json "$CONFIGS/default.json" 'del c["scheduler"]; c["optimizer"]["params"]["lr"] = 0.01'
RUN=(--config cnn.json --model "torchscript:$WORK/models/digits_cnn.pt" --data digits.h5 --data_inputs images
     --data_targets labels --eval_iters 4)

must_run 2 full "${RUN[@]}" --steps 40 --loss_csv full.csv
"$PY" - full.csv <<'PYEOF'
import csv, sys
loss = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
first, last = sum(loss[:3]) / 3, sum(loss[-3:]) / 3
print(f"digits CNN: first 3 steps {first:.4f}, last 3 steps {last:.4f}")
assert len(loss) == 40 and first > 1.9 and last < 0.6 * first, (first, last)
PYEOF

must_run 2 first "${RUN[@]}" --steps 20 --save_dir ckpt --save_interval 20
must_run 2 resumed "${RUN[@]}" --steps 40 --load_dir ckpt --loss_csv resumed.csv
compare_losses full.csv resumed.csv 0 21

"$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32" ckpt weights.safetensors --format safetensors >/dev/null
"$PY" - "$WORK/models/digits_cnn.pt" <<'PYEOF'
import json, struct, sys, torch
raw = open("weights.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = {k: v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
module = dict(torch.jit.load(sys.argv[1]).named_parameters())
assert set(header) == set(module), (sorted(header), sorted(module))
for name, p in module.items():
    assert header[name]["shape"] == list(p.shape), name
PYEOF
echo "PASS"
