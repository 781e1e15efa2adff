#!/usr/bin/env bash
# train with pipeline parallelism as a user runs it: pipeline.stages in the config (or
# --pipeline_parallel_size) splits the GPT over the ranks, and the losses are those of the
# data-parallel run with the same global batch (the same micro-batches in the same order);
# what a pipelined run does not do is one error line.
source "$(dirname "$0")/../apps/lib.sh"

write_config base.json "$CONFIGS/default.json" '
c["train_micro_batch_size_per_gpu"] = 2; c["gradient_accumulation_steps"] = 4; c.pop("train_batch_size", None)
c["gradient_clipping"] = 0.5'
write_config pipe.json base.json 'c["pipeline"] = {"stages": 2}'
ARGS=(--steps 6 --n_layer 3 --n_head 2 --n_embd 32 --block_size 16 --eval_iters 2 --eval_interval 3)

# 2x1 (one pipe) against one data-parallel rank: the same 4 micro-batches per step.
must_run 1 dp1 --config base.json "${ARGS[@]}" --loss_csv dp1.csv
must_run 2 pp2 --config pipe.json "${ARGS[@]}" --loss_csv pp2.csv
grep -qF '[train] pipeline: 2 stages x 1 data-parallel rank(s), 4 micro-batches per step; stage 0: embed .. h.0 | stage 1: h.1 .. head' pp2.out \
  || fail "no pipeline line: $(grep pipeline pp2.out)"
compare_losses pp2.csv dp1.csv 1e-5 || fail "2x1 losses differ from one rank's"

# 2x2 (two pipes of two stages, --pipeline_parallel_size) against two data-parallel ranks,
# ZeRO-1 over each stage's pair, partition_method uniform.
write_config z1.json base.json 'c["zero_optimization"] = {"stage": 1}; c["pipeline"] = {"partition_method": "uniform"}'
must_run 2 dp2 --config z1.json "${ARGS[@]}" --loss_csv dp2.csv
must_run 4 pp22 --config z1.json --pipeline_parallel_size 2 "${ARGS[@]}" --loss_csv pp22.csv
grep -qF '2 stages x 2 data-parallel rank(s)' pp22.out || fail "2x2: $(grep pipeline pp22.out)"
compare_losses pp22.csv dp2.csv 1e-5 || fail "2x2 losses differ from two data-parallel ranks'"
"$PY" - <<'PYEOF' || fail "validation losses"
import csv
a = {r["step"]: r["val_loss"] for r in csv.DictReader(open("pp22.csv")) if r.get("val_loss")}
b = {r["step"]: r["val_loss"] for r in csv.DictReader(open("dp2.csv")) if r.get("val_loss")}
assert a.keys() == b.keys() and a, (a, b)
for s in a: assert abs(float(a[s]) - float(b[s])) <= 1e-4 * abs(float(b[s])), (s, a[s], b[s])
PYEOF

# What a pipelined run refuses: one agreed error line, exit 1, before any work.
refused() {  # refused NP NAME 'expected text' train-args...
  local np=$1 name=$2 want=$3; shift 3
  local rc=0
  run_train "$np" "$name" "$@" || rc=$?
  [ $rc -eq 1 ] || fail "$name: exit $rc, want 1"
  [ "$(grep -c 'train: error:' "$name.err")" -eq 1 ] || fail "$name: $(cat "$name.err")"
  grep -qF "$want" "$name.err" || fail "$name: $(grep 'train: error' "$name.err")"
}
refused 2 save 'pipeline.stages 2: checkpoints of pipeline-parallel runs are not supported (--save_dir, --load_dir)' \
  --config pipe.json "${ARGS[@]}" --save_dir ckpt
refused 2 grid 'the world size 2 is not divisible by pipeline.stages 3' --config pipe.json --pipeline_parallel_size 3 "${ARGS[@]}"
refused 2 mlp 'pipeline parallelism splits the layers of --model gpt or llama; --model mlp is not a layer sequence' \
  --config pipe.json --model mlp "${ARGS[@]}"
write_config z3.json pipe.json 'c["zero_optimization"] = {"stage": 3}'
refused 2 zero3 'zero_optimization.stage 3 with pipeline.stages 2' --config z3.json "${ARGS[@]}"
echo "pipe_train_app: all passed"
