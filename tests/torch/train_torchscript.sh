#!/usr/bin/env bash
# train --model torchscript:PATH end to end: make_models.py's token LM (embedding + linear,
# cross-entropy) on the embedded corpus at 2 ranks, in fp32 (ZeRO stage 0, and stage 3 with
# offload to host memory: the same losses; the LM in its logits form: the same losses) and
# bf16 under ZeRO stage 2, and
# the errors a user meets (a file that is missing or is not a module, a wrong forward, --device
# cuda), each one line naming the file.
source "$DS_SOURCE_DIR/tests/apps/lib.sh"
"$PY" "$DS_SOURCE_DIR/tests/torch/make_models.py" "$WORK/models"
LM=torchscript:$WORK/models/lm.pt
RUN=(--config "$CONFIGS/default.json" --block_size 32 --eval_iters 2)

# Untrained, the LM's loss is about ln 256 = 5.55; 40 steps (30 of warm-up) bring it below 5.4.
final_val() { sed -n 's/.*final validation loss \([0-9.]*\).*/\1/p' "$1.out"; }
must_run 2 fp32 --model "$LM" "${RUN[@]}" --steps 40 --loss_csv fp32.csv
grep -q "model: $LM block_size=32 vocab_size=256" fp32.out || fail "fp32: no model line naming $LM"
v=$(final_val fp32)
"$PY" -c "import sys; sys.exit(0 if float('$v') < 5.4 else 1)" || fail "fp32: final validation loss $v, not below 5.4"

# ZeRO stage 3 with parameters and optimizer state offloaded to host memory: the same losses,
# the LM's embedding and head gathered one at a time (its forward is a sequence of blocks).
write_config z3_offload.json "$CONFIGS/default.json" \
  'c["zero_optimization"] = {"stage": 3, "offload_param": {"device": "cpu"}, "offload_optimizer": {"device": "cpu"}}'
must_run 2 z3 --config z3_offload.json --model "$LM" --block_size 32 --eval_iters 2 --steps 40 --loss_csv z3.csv
compare_losses fp32.csv z3.csv 1e-5
grep -q "lm.pt: ZeRO stage 3 gathers one block at a time (2 blocks: wte ... head)" z3.out z3.err \
  || fail "z3: no line saying the LM is gathered a block at a time"

# The same LM written as forward(inputs) -> logits (the app takes the cross-entropy): the same losses.
must_run 2 logits --model "torchscript:$WORK/models/lm_logits.pt" "${RUN[@]}" --steps 40 --loss_csv logits.csv
compare_losses fp32.csv logits.csv 1e-6

write_config bf16_z2.json "$CONFIGS/default.json" 'c["bf16"] = {"enabled": True}; c["zero_optimization"] = {"stage": 2}'
must_run 2 bf16 --config bf16_z2.json --model "$LM" --steps 20 --block_size 32 --eval_iters 2
grep -q "ZeRO stage 2, bf16 working" bf16.out || fail "bf16: not a bf16 ZeRO-2 run"
[ -n "$(final_val bf16)" ] || fail "bf16: no final validation loss"

# expect_error NAME TEXT args...: train fails on one line that contains TEXT.
expect_error() {
  local name=$1 text=$2; shift 2
  if run_train 1 "$name" "$@"; then fail "$name: train succeeded"; fi
  grep -q "^train: error: .*$text" "$name.err" || { cat "$name.err"; fail "$name: no error line with '$text'"; }
}
expect_error missing "$WORK/models/absent.pt does not exist" --model "torchscript:$WORK/models/absent.pt" "${RUN[@]}" --steps 2
echo "not a model" >notes.pt
expect_error not_module "$WORK/notes.pt is not a TorchScript module" --model "torchscript:$WORK/notes.pt" "${RUN[@]}" --steps 2
expect_error arity "wrong_arity.pt: forward must be forward(self, inputs: Tensor, targets: Tensor)" \
  --model "torchscript:$WORK/models/wrong_arity.pt" "${RUN[@]}" --steps 2
expect_error cuda "a TorchScript model trains on the CPU" --model "$LM" --device cuda "${RUN[@]}" --steps 2
# A train without its adapter plugin beside it (a copy elsewhere) says where it looked; the
# built-in models do not need the plugin (train does not load libtorch for them).
mkdir -p alone && cp "$TRAIN" alone/train
TRAIN=$WORK/alone/train expect_error no_plugin "the PyTorch adapter libds_train_torch.so is not installed beside train" \
  --model "$LM" "${RUN[@]}" --steps 2
! ldd "$TRAIN" | grep -q libtorch || fail "train links libtorch; it should load it only for --model torchscript:"
echo "PASS"
