#!/bin/bash
# Hugging Face GPT-2 weights in and out, checked against a plain-torch GPT-2 (hf_gpt2.py):
#  1. a safetensors file with transformers' names (transformer. prefix, Conv1D layout, mask
#     buffers, tied lm_head) loads into ds::nn::Gpt (hf_logits, the loader train uses) with
#     the same logits (1e-4 relative);
#  2. train --init_from that file (2 ranks, lr 0: the weights stay as loaded), then
#     ds_to_fp32 --hf_names gives back the same tensors, bit for bit;
#  3. a trained dstrain checkpoint exported with --hf_names gives torch the logits dstrain
#     computes from its own export (dstrain names);
#  4. mismatches end with one clear error line.
# Exit 77 (skipped) when /usr/bin/python3 cannot import torch.
set -euo pipefail
PY=${DS_SYSTEM_PYTHON:-/usr/bin/python3}
"$PY" -c "import torch" 2>/dev/null || { echo "SKIP: $PY cannot import torch"; exit 77; }
D=$(mktemp -d /tmp/ds_hf_gpt2.XXXXXX)
trap 'rm -rf "$D"' EXIT
HF="$PY $DS_SOURCE_DIR/tests/io/hf_gpt2.py"
LOGITS=$DS_BINARY_DIR/tests/io/hf_logits
TRAIN=$DS_BINARY_DIR/apps/train/train
TO_FP32=$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32
MPIRUN="$DS_MPIEXEC --oversubscribe --bind-to none"
SHAPE=2,2,32,16,256
RUN=(--n_head 2 --block_size 16 --sample_tokens 0 --eval_iters 0 --progress lines)
FLAGS=(--n_layer 2 --n_embd 32 "${RUN[@]}")
TOKENS=72,101,108,108,111,44,32,119,111,114,108,100,33,10,0,255
fail() { echo "FAIL: $*"; exit 1; }

# 1. HF -> dstrain logits.
$HF make "$D/hf.safetensors" "$D/torch.txt" $SHAPE $TOKENS
"$LOGITS" "$D/hf.safetensors" 2 2 32 16 256 $TOKENS >"$D/ds.txt"
$HF compare "$D/ds.txt" "$D/torch.txt" 1e-4

# 2. train --init_from, saved after one step at lr 0, exported with HF names.
"$PY" - "$DS_SOURCE_DIR/configs/default.json" "$D/lr0.json" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["optimizer"]["params"]["lr"] = 0.0
c.pop("scheduler")
c["train_micro_batch_size_per_gpu"] = 2
json.dump(c, open(sys.argv[2], "w"))
PYEOF
$MPIRUN -np 2 "$TRAIN" --config "$D/lr0.json" "${FLAGS[@]}" --steps 1 --init_from "$D/hf.safetensors" \
  --save_dir "$D/ck" >"$D/train.out" 2>"$D/train.err" || { cat "$D/train.out" "$D/train.err"; fail "train --init_from"; }
grep -F "[train] init: --init_from $D/hf.safetensors: 28 tensors (" "$D/train.out" | grep -q "by Hugging Face gpt2 names, 4 buffers skipped" \
  || { cat "$D/train.out"; fail "no init line"; }
"$TO_FP32" "$D/ck" "$D/back.safetensors" --format safetensors --hf_names >/dev/null
$HF same "$D/hf.safetensors" "$D/back.safetensors"

# 3. dstrain -> HF: a trained checkpoint, both exports, the same logits.
$MPIRUN -np 1 "$TRAIN" --config "$DS_SOURCE_DIR/configs/default.json" "${FLAGS[@]}" --steps 3 --save_dir "$D/ck2" \
  >"$D/train2.out" 2>&1 || { cat "$D/train2.out"; fail "train"; }
"$TO_FP32" "$D/ck2" "$D/ours.safetensors" --format safetensors >/dev/null
"$TO_FP32" "$D/ck2" "$D/hf2.safetensors" --format safetensors --hf_names >/dev/null
"$LOGITS" "$D/ours.safetensors" 2 2 32 16 256 $TOKENS >"$D/ds2.txt"
$HF logits "$D/hf2.safetensors" "$D/torch2.txt" $SHAPE $TOKENS
$HF compare "$D/ds2.txt" "$D/torch2.txt" 1e-4
# ... and the HF export loads back into dstrain too.
"$LOGITS" "$D/hf2.safetensors" 2 2 32 16 256 $TOKENS >"$D/ds3.txt"
cmp -s "$D/ds2.txt" "$D/ds3.txt" || fail "the --hf_names export loads back with other logits"

# 4. Errors: one line naming the tensor and the shapes, non-zero exit.
expect_error() {  # expect_error TEXT command...
  local want=$1; shift
  if "$@" >"$D/err.out" 2>"$D/err.txt"; then fail "$* succeeded"; fi
  grep -qF -- "$want" "$D/err.txt" || { cat "$D/err.out" "$D/err.txt"; fail "no '$want' from $*"; }
}
expect_error "no tensor 'h.2.ln_1.weight' (or with a 'transformer.' prefix) for the model's parameter 'h.2.ln_1.weight' [32]" \
  $MPIRUN -np 1 "$TRAIN" --config "$D/lr0.json" "${RUN[@]}" --n_layer 3 --n_embd 32 --steps 1 --init_from "$D/hf.safetensors"
expect_error "tensor 'transformer.wte.weight' has shape [256, 32], the model needs [256, 64]" \
  $MPIRUN -np 1 "$TRAIN" --config "$D/lr0.json" "${RUN[@]}" --n_layer 2 --n_embd 64 --steps 1 --init_from "$D/hf.safetensors"
expect_error "train: error: --init_from and --load_dir exclude each other: --load_dir resumes a run" \
  "$TRAIN" --config "$D/lr0.json" --init_from "$D/hf.safetensors" --load_dir "$D/ck"
head -c 100 "$D/hf.safetensors" >"$D/cut.safetensors"
expect_error "$D/cut.safetensors: bad header length" \
  $MPIRUN -np 1 "$TRAIN" --config "$D/lr0.json" "${FLAGS[@]}" --steps 1 --init_from "$D/cut.safetensors"
expect_error "ds_to_fp32: error: --hf_names needs --format safetensors" "$TO_FP32" "$D/ck" "$D/x.h5" --hf_names
echo "hf_gpt2_test: OK"
