#!/usr/bin/env bash
# A TorchScript CNN on HDF5 arrays: scikit-learn's bundled digits (8x8 images, 10 classes)
# written with h5py, trained by train --model torchscript:digits_cnn.pt on 2 ranks. The loss
# falls; a run saved at step 20 and resumed repeats the unbroken run's losses exactly; the
# checkpoint's weights load back into the PyTorch model.
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

# The round trip: ds_to_fp32's safetensors file read with plain Python (8-byte header length,
# JSON header, raw little-endian data) into make_models.py's DigitsCnn with
# load_state_dict(strict=True): the tensors are the trained weights dstrain saved
# (model_states.h5 through h5py), not the initial ones, and the loss on the digits is lower.
"$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32" ckpt weights.safetensors --format safetensors >/dev/null
"$PY" - "$DS_SOURCE_DIR/tests/torch" "$WORK/models/digits_cnn.pt" <<'PYEOF'
import json, struct, sys
import h5py, numpy as np, torch
sys.path.insert(0, sys.argv[1])
from make_models import DigitsCnn
raw = open("weights.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = {k: v for k, v in json.loads(raw[8:8 + n]).items() if k != "__metadata__"}
state = {}
for name, h in header.items():
    assert h["dtype"] == "F32", (name, h["dtype"])
    begin, end = h["data_offsets"]
    state[name] = torch.from_numpy(np.frombuffer(raw[8 + n + begin:8 + n + end], dtype="<f4").copy()).reshape(h["shape"])
model = DigitsCnn()
model.load_state_dict(state, strict=True)
initial = torch.jit.load(sys.argv[2])
tag = open("ckpt/latest").read().strip()
with h5py.File(f"ckpt/{tag}/model_states.h5", "r") as saved:
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), torch.from_numpy(saved["params"][name][()])), name
        assert not torch.equal(p.detach(), dict(initial.named_parameters())[name].detach()), name
with h5py.File("digits.h5", "r") as d:
    x, y = torch.from_numpy(d["images"][()]), torch.from_numpy(d["labels"][()])
with torch.no_grad():
    trained, untrained = model(x, y).item(), initial(x, y).item()
print(f"round trip: {len(state)} tensors equal to the checkpoint's; digits loss {untrained:.4f} -> {trained:.4f}")
assert trained < 0.8 * untrained, (trained, untrained)
PYEOF
echo "PASS"
