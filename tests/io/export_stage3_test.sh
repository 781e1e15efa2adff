#!/bin/bash
# ds_to_fp32 on a ZeRO stage 3 checkpoint (multi-range shards, parameters only in the fp32
# master): a trained bf16 Llama checkpoint is rewritten by ckpt_restage as 3 ranks of stage 3
# save it (interleaved ranges, no params/<name>); read_with_h5py.py reads it, and its
# exports in every format (HDF5, safetensors, safetensors --hf_names) hold the same tensors,
# bit for bit, as the original's; check_export.py compares them with the shards.
set -euo pipefail
source "$DS_SOURCE_DIR/tests/io/lib.sh"
PY=${DS_SYSTEM_PYTHON:-/usr/bin/python3}
scratch_dir export_s3
fail() { echo "FAIL: $*"; exit 1; }
"$PY" - "$DS_SOURCE_DIR/configs/llama_tiny.json" "$D/bf16.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["bf16"] = {"enabled": True}
c["train_micro_batch_size_per_gpu"] = 2
json.dump(c, open(sys.argv[2], "w"))
PYEOF
$MPIRUN -np 1 "$DS_BINARY_DIR/apps/train/train" --config "$D/bf16.json" --n_head 4 --n_kv_head 2 --n_embd 32 \
  --block_size 16 --n_layer 2 --sample_tokens 0 --eval_iters 0 --progress lines --steps 2 --save_dir "$D/ck" \
  >"$D/train.out" 2>&1 || { cat "$D/train.out"; fail "train"; }
$MPIRUN -np 3 "$DS_BINARY_DIR/tests/io/ckpt_restage" "$D/ck" "$D/s3"
TAG=$(cat "$D/s3/latest")
"$PY" - "$D/s3/$TAG" <<'PYEOF'
import json, sys, h5py
d = sys.argv[1]
m = json.load(open(d + "/manifest.json"))
assert m["params_in_master"] is True and m["zero_stage"] == 3 and m["working_dtype"] == "bf16", m
assert all("position" in p for p in m["partitions"]) and len(m["partitions"]) > 3, m["partitions"]
with h5py.File(d + "/model_states.h5") as f:
    assert "params" not in f, list(f)
print(f"stage 3 layout: {len(m['partitions'])} ranges in 3 files, no params/ datasets")
PYEOF
"$PY" "$DS_SOURCE_DIR/tests/io/read_with_h5py.py" "$D/s3"
for f in "hdf5 h5" "safetensors safetensors" "safetensors hf.safetensors --hf_names"; do
  set -- $f
  for src in ck s3; do
    "$TO_FP32" "$D/$src" "$D/$src.$2" --format "$1" "${@:3}" >"$D/$src.$2.out"
  done
done
grep -q "from $D/s3/$TAG (world size 3, ZeRO stage 3, fp32 master)" "$D/s3.h5.out" || { cat "$D/s3.h5.out"; fail "summary line"; }
"$PY" - "$D" <<'PYEOF'
import json, struct, sys, h5py
d = sys.argv[1]
def st(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__")
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
for name in ("safetensors", "hf.safetensors"):
    a, b = st(f"{d}/ck.{name}"), st(f"{d}/s3.{name}")
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    bad = [k for k in a if a[k] != b[k]]
    assert not bad, f"{name}: tensors differ: {bad}"
with h5py.File(f"{d}/ck.h5") as a, h5py.File(f"{d}/s3.h5") as b:
    assert sorted(a) == sorted(b)
    bad = [k for k in a if a[k][()].tobytes() != b[k][()].tobytes() or a[k].shape != b[k].shape]
    assert not bad, f"h5: tensors differ: {bad}"
    n = len(a)
print(f"same tensors in all three formats: {n} ({len(st(d + '/s3.hf.safetensors'))} by Hugging Face names)")
PYEOF
"$PY" "$DS_SOURCE_DIR/tests/io/check_export.py" "$D/s3" "$D/s3.h5" "$D/s3.safetensors"
echo "export_stage3_test: OK"
