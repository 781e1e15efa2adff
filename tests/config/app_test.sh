#!/usr/bin/env bash
# ds_config run as a user runs it: exit codes, stdout JSON, stderr messages.
# Usage: app_test.sh <path to ds_config>
set -u
APP=$1
DATA=$(cd "$(dirname "$0")" && pwd)/data
PY=${DS_SYSTEM_PYTHON:-/usr/bin/python3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# run NAME EXPECTED_RC ARGS...: runs the app, stdout/stderr into $TMP/NAME.{out,err}
run() {
  local name=$1 want=$2
  shift 2
  "$APP" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    fail "$name: exit code $rc, expected $want (stderr: $(head -c 400 "$TMP/$name.err"))"
  fi
}
expect_err() {  # NAME TEXT: stderr contains TEXT
  grep -qF -- "$2" "$TMP/$1.err" || fail "$1: stderr lacks '$2': $(head -c 400 "$TMP/$1.err")"
}
json_check() {  # NAME PYTHON-EXPR over j (the parsed stdout)
  "$PY" -c "import json,sys; j=json.load(open('$TMP/$1.out')); sys.exit(0 if ($2) else 1)" ||
    fail "$1: stdout check failed: $2"
}

# Good files: exit 0, resolved JSON on stdout, nothing but warnings on stderr.
run full 0 check "$DATA/good_full.json" --world_size 2
json_check full "j['train_batch_size']==16 and j['train_micro_batch_size_per_gpu']==4 and j['gradient_accumulation_steps']==2"
json_check full "j['optimizer']['type']=='AdamW' and j['optimizer']['params']['lr']==3e-4 and j['zero_optimization']['stage']==2"
json_check full "j['scheduler']['params']['total_num_steps']==20 and j['fp16']['enabled'] and j['model']['kind']=='mlp'"
json_check full "j['communication_data_type']=='fp16' and j['seed']==1234 and j['steps_per_print']==10"
[ -s "$TMP/full.err" ] && fail "full: unexpected stderr: $(cat "$TMP/full.err")"

run minimal 0 check "$DATA/good_minimal.json" --world_size 3
json_check minimal "j['train_batch_size']==6 and j['gradient_accumulation_steps']==1 and j['optimizer'] is None and j['gradient_clipping']==1.0"
run minimal_ws1 0 check "$DATA/good_minimal.json"
json_check minimal_ws1 "j['train_batch_size']==2"

# Hugging Face "auto" values: filled from --lr and the batch arithmetic, one note each on stderr
# (stdout stays pure JSON); without --lr the learning rate is refused, and so is an "auto" precision.
run auto 0 check "$DATA/good_hf_auto.json" --world_size 2 --lr 1e-3
json_check auto "j['train_batch_size']==8 and j['optimizer']['params']['lr']==1e-3 and j['fp16']['enabled']==False"
expect_err auto "ds_config: note: $DATA/good_hf_auto.json:8:44: optimizer.params.lr: \"auto\" -> 0.001 (from --lr)"
expect_err auto "gradient_accumulation_steps: \"auto\" -> 1 (from the batch arithmetic)"
expect_err auto "optimizer.params.betas: \"auto\" -> [0.9,0.999] (dstrain's default, which is DeepSpeed's)"
grep -v '^ds_config: note: ' "$TMP/auto.err" | grep -q . && fail "auto: stderr holds more than notes: $(cat "$TMP/auto.err")"
run auto_no_lr 1 check "$DATA/good_hf_auto.json" --world_size 2
expect_err auto_no_lr "good_hf_auto.json:8:44: optimizer.params.lr: \"auto\" is a placeholder the Hugging Face Trainer fills"
expect_err auto_no_lr "write a number, or pass --lr"
[ -s "$TMP/auto_no_lr.out" ] && fail "auto_no_lr: stdout not empty"
run auto_precision 1 check '{"train_batch_size": 8, "bf16": {"enabled": "auto"}}' --lr 1e-3
expect_err auto_precision 'bf16.enabled: "auto" is a placeholder'
expect_err auto_precision "write true or false"
# Messages of a one-process tool carry no source location and no rank tag.
grep -qE '\[(src|io|mpi|apps)/|\[rank' "$TMP/auto_no_lr.err" "$TMP/auto.err" && fail "auto: internal location or rank tag in stderr"

# The resolved output is itself a valid config that resolves to the same thing.
run roundtrip 0 check "$TMP/full.out" --world_size 2
cmp -s "$TMP/full.out" "$TMP/roundtrip.out" || fail "roundtrip: resolved config changed when re-read"

# ZeRO stage 3 as HF Trainer's zero3 config writes it: "auto" sizes take DeepSpeed's defaults,
# the resolved output names every stage-3 key, no warnings, and it reads back unchanged.
run stage3 0 check "$DATA/good_stage3.json" --world_size 2
json_check stage3 "j['zero_optimization']['stage']==3 and j['zero_optimization']['stage3_prefetch_bucket_size']==50000000"
json_check stage3 "j['zero_optimization']['stage3_param_persistence_threshold']==100000 and j['zero_optimization']['stage3_model_persistence_threshold']==2**63-1"
json_check stage3 "j['zero_optimization']['stage3_gather_16bit_weights_on_model_save'] is True and j['zero_optimization']['sub_group_size']==10**9"
grep -v '^ds_config: note: ' "$TMP/stage3.err" | grep -q . && fail "stage3: unexpected stderr: $(cat "$TMP/stage3.err")"
expect_err stage3 'zero_optimization.reduce_bucket_size: "auto" -> 500000000'
expect_err stage3 'zero_optimization.stage3_prefetch_bucket_size: "auto" -> 50000000' 
run stage3_roundtrip 0 check "$TMP/stage3.out" --world_size 2
cmp -s "$TMP/stage3.out" "$TMP/stage3_roundtrip.out" || fail "stage3_roundtrip: resolved config changed when re-read"
[ -s "$TMP/stage3_roundtrip.err" ] && fail "stage3_roundtrip: unexpected stderr: $(cat "$TMP/stage3_roundtrip.err")"
run stage3_old 0 check '{"train_batch_size": 2, "zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}}'
expect_err stage3_old "zero_optimization.stage3_gather_fp16_weights_on_model_save is deprecated; write stage3_gather_16bit_weights_on_model_save"
json_check stage3_old "j['zero_optimization']['stage3_gather_16bit_weights_on_model_save'] is True"
run stage3_both 1 check '{"zero_optimization": {"stage": 3, "stage3_max_live_parameters": 5, "max_live_parameters": 5}}'
expect_err stage3_both "both zero_optimization.stage3_max_live_parameters and zero_optimization.max_live_parameters are given"

# Offload: an NVMe config with aio resolves with every offload key, no warnings, and reads back
# unchanged; an offload at a stage that does not take it is one error line naming both keys.
run offload 0 check '{"train_batch_size": 2, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "NVMe", "nvme_path": "/local_nvme"}, "offload_param": {"device": "cpu"}}, "aio": {"thread_count": 2}}'
json_check offload "j['zero_optimization']['offload_optimizer']['device']=='nvme' and j['zero_optimization']['offload_optimizer']['nvme_path']=='/local_nvme'"
json_check offload "j['zero_optimization']['offload_param']['buffer_count']==5 and j['aio']['intra_op_parallelism']==2 and j['aio']['block_size']==1048576"
[ -s "$TMP/offload.err" ] && fail "offload: unexpected stderr: $(cat "$TMP/offload.err")"
run offload_roundtrip 0 check "$TMP/offload.out"
cmp -s "$TMP/offload.out" "$TMP/offload_roundtrip.out" || fail "offload_roundtrip: resolved config changed when re-read"
run offload_stage 0 check '{"train_batch_size": 2, "zero_optimization": {"stage": 2, "offload_param": {"device": "nvme", "nvme_path": "/p"}}}'
expect_err offload_stage 'zero_optimization.offload_param (device "nvme") is ignored below stage 3 (stage is 2)'
json_check offload_stage "j['zero_optimization']['offload_param']['device']=='none'"

# Inline JSON text is accepted too (DeepSpeed's initialize() takes a path or JSON).
run inline 0 check '{"train_batch_size": 4}' --world_size 2
json_check inline "j['train_micro_batch_size_per_gpu']==2"

# Warnings go to stderr, exit 0.
run warn 0 check "$DATA/warn_top_level.json"
expect_err warn "warn_top_level.json:3:3: unknown top-level key \"gradient_cliping\" (did you mean \"gradient_clipping\"?)"
json_check warn "j['gradient_clipping']==1.0"

# Bad files: exit 1, one "ds_config: error:" line naming file:line:column and the key.
run syntax 1 check "$DATA/bad_syntax.json"
expect_err syntax "ds_config: error: $DATA/bad_syntax.json:5:5: expected ',' or '}' after the value of \"enabled\""
run type 1 check "$DATA/bad_type.json"
expect_err type "bad_type.json:4:5: fp16.loss_scale: expected a number >= 0, got \"abc\""
run unknown 1 check "$DATA/bad_unknown_key.json"
expect_err unknown "bad_unknown_key.json:5:5: zero_optimization.reduce_bucket_sise: unknown key in zero_optimization (did you mean \"reduce_bucket_size\"?)"
run dup 1 check "$DATA/bad_duplicate.json"
expect_err dup "bad_duplicate.json:4:3: duplicate key \"fp16\""
run batch 1 check "$DATA/bad_batch.json" --world_size 2
expect_err batch "train_batch_size 10 != train_micro_batch_size_per_gpu 3 * gradient_accumulation_steps 1 (derived) * world_size 2; set train_batch_size to 6"
run batch_ws5 1 check "$DATA/bad_batch.json" --world_size 5
expect_err batch_ws5 "gradient_accumulation_steps = train_batch_size 10 // train_micro_batch_size_per_gpu 3 // world_size 5 = 0, which must be > 0"
run both 1 check "$DATA/bad_fp16_bf16.json"
expect_err both "bad_fp16_bf16.json:4:12: bf16.enabled: fp16 and bf16 cannot both be enabled"
run mgn 1 check "$DATA/bad_max_grad_norm.json"
expect_err mgn "optimizer.params.max_grad_norm: is not accepted here"
run missing 1 check "$TMP/does_not_exist.json"
expect_err missing "ds_config: error: config \"$TMP/does_not_exist.json\" is neither an existing file"
[ "$(wc -l <"$TMP/type.err")" -eq 1 ] || fail "type: error is not one line: $(cat "$TMP/type.err")"
[ -s "$TMP/type.out" ] && fail "type: stdout not empty on error"

# Usage errors: non-zero, no crash.
"$APP" >"$TMP/noargs.out" 2>&1 && fail "no subcommand accepted"
grep -q "subcommand" "$TMP/noargs.out" || fail "no usage message without a subcommand: $(cat "$TMP/noargs.out")"
"$APP" check "$DATA/good_minimal.json" --world_size 0 >/dev/null 2>&1 && fail "world_size 0 accepted"

# schedule: "step,lr" CSV, the lr the optimizer applies at global steps 1..N. The scheduler
# steps after each optimizer step, so step k applies DeepSpeed's lr for it = k - 2.
csv_check() {  # NAME PYTHON-EXPR over rows (dict step -> lr) and lines (the raw lines)
  "$PY" -c "
import sys
lines = open('$TMP/$1.out').read().splitlines()
assert lines[0] == 'step,lr', lines[0]
rows = {int(a): float(b) for a, b in (l.split(',') for l in lines[1:])}
close = lambda a, b: abs(a - b) <= 1e-9 + 1e-5 * abs(b)
sys.exit(0 if ($2) else 1)" || fail "$1: schedule check failed: $2 ($(head -5 "$TMP/$1.out" | tr '\n' ' '))"
}
run sched_warmup 0 schedule '{"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 1000}}}' --steps 1001
csv_check sched_warmup "len(rows) == 1001 and sorted(rows) == list(range(1, 1002)) and rows[1] == 0 and rows[2] == 0 and close(rows[3], 1.00343e-4) and close(rows[12], 3.47131e-4) and close(rows[1001], 1e-3)"
run sched_onecycle 0 schedule '{"train_batch_size": 2, "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-3, "cycle_first_step_size": 1000}}}' --steps 2001
csv_check sched_onecycle "close(rows[1], 1e-4) and close(rows[2], 1.009e-4) and close(rows[501], 5.5e-4) and close(rows[1001], 1e-3) and close(rows[1501], 5.5e-4) and close(rows[2001], 1e-4)"
run sched_decay 0 schedule "$DATA/good_full.json" --steps 25 --world_size 2
csv_check sched_decay "len(rows) == 25 and close(rows[7], 3e-4) and close(rows[17], 3e-4 * 5 / 15) and rows[25] == 0"
run sched_const 0 schedule "$DATA/good_minimal.json" --steps 3
csv_check sched_const "rows == {1: 1e-3, 2: 1e-3, 3: 1e-3}"
run sched_bad 1 schedule "$DATA/bad_batch.json" --steps 3 --world_size 2
expect_err sched_bad "ds_config: error:"
"$APP" schedule "$DATA/good_minimal.json" >/dev/null 2>&1 && fail "schedule without --steps accepted"

# comms_logger.prof_ops names collectives: checked as train checks them, only when enabled.
printf '{"train_batch_size": 8, "comms_logger": {"enabled": true, "prof_all": false, "prof_ops": ["allreduce"]}}' >"$TMP/cl_bad.json"
run cl_bad 1 check "$TMP/cl_bad.json"
expect_err cl_bad 'comms_logger.prof_ops: unknown collective "allreduce"; expected all_reduce'
printf '{"train_batch_size": 8, "comms_logger": {"enabled": true, "prof_all": false, "prof_ops": ["all_reduce", "all_gather_into_tensor"]}}' >"$TMP/cl_good.json"
run cl_good 0 check "$TMP/cl_good.json"

if [ "$fails" -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "ds_config app: all checks passed"
