#!/bin/bash
# Hugging Face Llama weights through train and ds_to_fp32: a trained Llama checkpoint exported
# with --hf_names (LlamaForCausalLM names), plus the rotary inv_freq buffers older
# transformers saved, starts a new run (train --model llama --init_from, 2 ranks, lr 0: the
# weights stay as loaded) whose export is the same tensors bit for bit. Needs no torch (the
# Llama's numerics against PyTorch are nn_llama_vs_torch's job; here the names are the same).
set -euo pipefail
PY=${DS_SYSTEM_PYTHON:-/usr/bin/python3}
D=$(mktemp -d /tmp/ds_hf_llama.XXXXXX)
trap 'rm -rf "$D"' EXIT
TRAIN=$DS_BINARY_DIR/apps/train/train
TO_FP32=$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32
MPIRUN="$DS_MPIEXEC --oversubscribe --bind-to none"
CFG=$DS_SOURCE_DIR/configs/llama_tiny.json
FLAGS=(--n_head 4 --n_kv_head 2 --n_embd 32 --block_size 16 --sample_tokens 0 --eval_iters 0 --progress lines)
fail() { echo "FAIL: $*"; exit 1; }

$MPIRUN -np 1 "$TRAIN" --config "$CFG" "${FLAGS[@]}" --n_layer 2 --steps 3 --save_dir "$D/ck" >"$D/t1.out" 2>&1 \
  || { cat "$D/t1.out"; fail "train"; }
"$TO_FP32" "$D/ck" "$D/hf.safetensors" --format safetensors --hf_names >/dev/null

# hf_buf.safetensors: the export plus an inv_freq buffer per layer (as transformers < 4.31
# saved them), written by hand (struct + json); lr0.json: the config at lr 0.
"$PY" - "$D/hf.safetensors" "$D/lr0.json" "$CFG" <<'PYEOF'
import json, struct, sys
path, lr0, cfg = sys.argv[1:4]
raw = open(path, "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n])
assert h["__metadata__"]["layout"] == "huggingface" and h["__metadata__"]["architecture"] == "llama", h["__metadata__"]
assert "model.layers.1.mlp.down_proj.weight" in h and "lm_head.weight" in h, sorted(h)
data = raw[8 + n:]
end = len(data)
for l in range(2):
    h[f"model.layers.{l}.self_attn.rotary_emb.inv_freq"] = {"dtype": "F32", "shape": [4], "data_offsets": [end, end + 16]}
    data += struct.pack("<4f", 1.0, 0.1, 0.01, 0.001)
    end += 16
t = json.dumps(h).encode()
t += b" " * ((8 - len(t) % 8) % 8)
open(path.replace("hf.", "hf_buf."), "wb").write(struct.pack("<Q", len(t)) + t + data)
c = json.load(open(cfg))
c["optimizer"]["params"]["lr"] = 0.0
c.pop("scheduler")
c["train_micro_batch_size_per_gpu"] = 2
json.dump(c, open(lr0, "w"))
PYEOF

$MPIRUN -np 2 "$TRAIN" --config "$D/lr0.json" "${FLAGS[@]}" --n_layer 2 --steps 1 --init_from "$D/hf_buf.safetensors" \
  --save_dir "$D/ck2" >"$D/t2.out" 2>&1 || { cat "$D/t2.out"; fail "train --init_from"; }
grep -F "[train] init: --init_from $D/hf_buf.safetensors: 21 tensors (" "$D/t2.out" \
  | grep -q "by Hugging Face llama names, 2 buffers skipped" || { cat "$D/t2.out"; fail "no init line"; }
"$TO_FP32" "$D/ck2" "$D/back.safetensors" --format safetensors --hf_names >/dev/null
"$PY" - "$D/hf.safetensors" "$D/back.safetensors" <<'PYEOF'
import json, struct, sys
def tensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__")
    return {k: (v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
bad = [k for k in a if a[k] != b[k]]
assert not bad, f"tensors differ after train --init_from: {bad}"
print(f"same tensors: {len(a)}")
PYEOF

# A 2-layer file into 3 layers: one line naming the missing tensor.
if $MPIRUN -np 1 "$TRAIN" --config "$D/lr0.json" "${FLAGS[@]}" --n_layer 3 --steps 1 --init_from "$D/hf.safetensors" \
  >"$D/e.out" 2>&1; then fail "a 2-layer file loaded into 3 layers"; fi
grep -qF "train: error: $D/hf.safetensors: no tensor 'model.layers.2.self_attn.q_proj.weight' for the model's parameter" "$D/e.out" \
  || { cat "$D/e.out"; fail "no error line"; }
echo "hf_llama_test: OK"
