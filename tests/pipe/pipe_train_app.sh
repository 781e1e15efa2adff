#!/usr/bin/env bash
# train with pipeline parallelism as a user runs it: pipeline.stages in the config (or
# --pipeline_parallel_size) splits the GPT over the ranks, and the losses are those of the
# data-parallel run with the same global batch (the same micro-batches in the same order);
# checkpoints resume across pipelined and data-parallel runs; what a pipelined run does not
# do is one error line.
source "$(dirname "$0")/../apps/lib.sh"

write_config base.json "$CONFIGS/default.json" '
c["train_micro_batch_size_per_gpu"] = 2; c["gradient_accumulation_steps"] = 4; c.pop("train_batch_size", None)
c["gradient_clipping"] = 0.5'
write_config pipe.json base.json 'c["pipeline"] = {"stages": 2}'
ARGS=(--steps 6 --n_layer 3 --n_head 2 --n_embd 32 --block_size 16 --eval_iters 2 --eval_interval 3)

# 2x1 (one pipe) against one data-parallel rank: the same 4 micro-batches per step. Both
# save at step 3 for the resumes below.
must_run 1 dp1 --config base.json "${ARGS[@]}" --loss_csv dp1.csv --save_dir ck_dp --save_interval 3
must_run 2 pp2 --config pipe.json "${ARGS[@]}" --loss_csv pp2.csv --save_dir ck_pp --save_interval 3
grep -qF '[train] pipeline: 2 stages x 1 data-parallel rank(s), 4 micro-batches per step; stage 0: embed .. h.0 | stage 1: h.1 .. head' pp2.out \
  || fail "no pipeline line: $(grep pipeline pp2.out)"
compare_losses pp2.csv dp1.csv 1e-5 || fail "2x1 losses differ from one rank's"
grep -qF '[train] end of sample' pp2.out || fail "2x1: no sample from the gathered model"

# A pipelined checkpoint resumes data parallel, and a data-parallel one pipelined: steps 4-6
# as the uninterrupted runs had them.
must_run 1 res_dp --config base.json "${ARGS[@]}" --loss_csv res_dp.csv --load_dir ck_pp --ckpt_id global_step3
grep -qF 'resumed from' res_dp.out || fail "no resume line: $(tail -3 res_dp.out)"
compare_losses res_dp.csv pp2.csv 1e-5 4 || fail "data-parallel resume of a 2x1 checkpoint"
must_run 2 res_pp --config pipe.json "${ARGS[@]}" --loss_csv res_pp.csv --load_dir ck_dp --ckpt_id global_step3
compare_losses res_pp.csv dp1.csv 1e-5 4 || fail "2x1 resume of a data-parallel checkpoint"
# ds_to_fp32 exports the pipelined checkpoint like the data-parallel one: the same tensors,
# equal within the runs' difference (1e-5 relative losses).
TO_FP32=$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32
"$TO_FP32" ck_pp pp.safetensors --format safetensors >/dev/null 2>to_fp32.err || fail "ds_to_fp32: $(cat to_fp32.err)"
"$TO_FP32" ck_dp dp.safetensors --format safetensors >/dev/null 2>to_fp32.err || fail "ds_to_fp32: $(cat to_fp32.err)"
"$PY" - <<'PYEOF' || fail "exported tensors differ"
import json, struct
def read(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None)
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]) for k, v in h.items()}
a, b = read("pp.safetensors"), read("dp.safetensors")
assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
assert worst < 1e-4, worst
PYEOF

# --init_from the exported weights: a 2x1 run starts where one data-parallel rank starts.
must_run 1 init_dp --config base.json "${ARGS[@]:2}" --steps 2 --loss_csv init_dp.csv --init_from dp.safetensors
must_run 2 init_pp --config pipe.json "${ARGS[@]:2}" --steps 2 --loss_csv init_pp.csv --init_from dp.safetensors
compare_losses init_pp.csv init_dp.csv 1e-5 || fail "2x1 --init_from differs from one rank's"
"$PY" -c "
import csv; a=[float(r['loss']) for r in csv.DictReader(open('init_pp.csv'))]; b=[float(r['loss']) for r in csv.DictReader(open('pp2.csv'))]
assert abs(a[0] - b[0]) > 1e-3, (a, b)" || fail "--init_from: the first loss is the random init's"

# 2x2 (two pipes of two stages, --pipeline_parallel_size) against two data-parallel ranks,
# ZeRO-1 over each stage's pair, partition_method uniform.
write_config z1.json base.json 'c["zero_optimization"] = {"stage": 1}; c["pipeline"] = {"partition_method": "uniform"}'
must_run 2 dp2 --config z1.json "${ARGS[@]}" --loss_csv dp2.csv
must_run 4 pp22 --config z1.json --pipeline_parallel_size 2 "${ARGS[@]}" --loss_csv pp22.csv --save_dir ck22 \
  --save_interval 3
grep -qF '2 stages x 2 data-parallel rank(s)' pp22.out || fail "2x2: $(grep pipeline pp22.out)"
compare_losses pp22.csv dp2.csv 1e-5 || fail "2x2 losses differ from two data-parallel ranks'"
"$PY" - <<'PYEOF' || fail "validation losses"
import csv
a = {r["step"]: r["val_loss"] for r in csv.DictReader(open("pp22.csv")) if r.get("val_loss")}
b = {r["step"]: r["val_loss"] for r in csv.DictReader(open("dp2.csv")) if r.get("val_loss")}
assert a.keys() == b.keys() and a, (a, b)
for s in a: assert abs(float(a[s]) - float(b[s])) <= 1e-4 * abs(float(b[s])), (s, a[s], b[s])
PYEOF

# ZeRO-3 inside each stage of a 2x2 grid: the same losses.
write_config z3.json z1.json 'c["zero_optimization"] = {"stage": 3}'
must_run 4 pp22z3 --config z3.json --pipeline_parallel_size 2 "${ARGS[@]}" --loss_csv pp22z3.csv
compare_losses pp22z3.csv dp2.csv 1e-5 || fail "2x2 at ZeRO-3 differs from two data-parallel ranks at ZeRO-1"

# The 2x2 checkpoint on 2 ranks as 2x1 (the same global batch: 8 micro-batches per pipe).
write_config g8.json z1.json 'c["gradient_accumulation_steps"] = 8; c["pipeline"]["stages"] = 2'
must_run 2 res21 --config g8.json "${ARGS[@]}" --loss_csv res21.csv --load_dir ck22 --ckpt_id global_step3
compare_losses res21.csv pp22.csv 1e-5 4 || fail "2x1 resume of a 2x2 checkpoint"

# What a pipelined run refuses: one agreed error line, exit 1, before any work.
refused() {  # refused NP NAME 'expected text' train-args...
  local np=$1 name=$2 want=$3; shift 3
  local rc=0
  run_train "$np" "$name" "$@" || rc=$?
  [ $rc -eq 1 ] || fail "$name: exit $rc, want 1"
  [ "$(grep -c 'train: error:' "$name.err")" -eq 1 ] || fail "$name: $(cat "$name.err")"
  grep -qF "$want" "$name.err" || fail "$name: $(grep 'train: error' "$name.err")"
}
refused 2 grid 'the world size 2 is not divisible by pipeline.stages 3' --config pipe.json --pipeline_parallel_size 3 "${ARGS[@]}"
refused 2 mlp 'pipeline parallelism splits the layers of --model gpt or llama; --model mlp is not a layer sequence' \
  --config pipe.json --model mlp "${ARGS[@]}"
echo "pipe_train_app: all passed"
