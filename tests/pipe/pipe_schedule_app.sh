#!/usr/bin/env bash
# `ds_config pipe-schedule` as a user runs it: DeepSpeed's schedules printed stage by stage,
# one line per step (tables worked out from DeepSpeed's runtime/pipe/schedule.py rules), one
# stage with --stage_id, the inference schedule with --eval, and one-line errors.
source "$(dirname "$0")/../apps/tools_lib.sh" pipe_schedule
DS_CONFIG=$B/ds_config/ds_config

# expect NAME WANT ARGS...: stdout of `ds_config pipe-schedule ARGS` equals WANT, exit 0.
expect() {
  local name=$1 want=$2
  shift 2
  local got
  got=$("$DS_CONFIG" pipe-schedule "$@" 2>"$T/err") || { fail "$name: exit $? ($(cat "$T/err"))"; return; }
  [ "$got" == "$want" ] || fail "$name: got
$got
want
$want"
}

expect "train 2 stages x 2 micro-batches" "stage 0 (2 pipe buffers):
  step 0: LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)
  step 1: SendActivation(buffer_id=0)
  step 2: LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)
  step 3: RecvGrad(buffer_id=0) SendActivation(buffer_id=1) BackwardPass(buffer_id=0)
  step 4: (idle)
  step 5: RecvGrad(buffer_id=1) BackwardPass(buffer_id=1) ReduceTiedGrads() ReduceGrads() OptimizerStep()
stage 1 (2 pipe buffers):
  step 0: (idle)
  step 1: RecvActivation(buffer_id=0) LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)
  step 2: BackwardPass(buffer_id=0)
  step 3: SendGrad(buffer_id=0) RecvActivation(buffer_id=1) LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)
  step 4: BackwardPass(buffer_id=1)
  step 5: SendGrad(buffer_id=1) ReduceTiedGrads() ReduceGrads() OptimizerStep()" --stages 2 --micro_batches 2

# Stage 0 of 4 with 8 micro-batches holds 4 forward passes (buffers 0..3) before its first backward.
expect "train stage 0 of 4 x 8" "stage 0 (4 pipe buffers):
  step 0: LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)
  step 1: SendActivation(buffer_id=0)
  step 2: LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)
  step 3: SendActivation(buffer_id=1)
  step 4: LoadMicroBatch(buffer_id=2) ForwardPass(buffer_id=2)
  step 5: SendActivation(buffer_id=2)
  step 6: LoadMicroBatch(buffer_id=3) ForwardPass(buffer_id=3)
  step 7: RecvGrad(buffer_id=0) SendActivation(buffer_id=3) BackwardPass(buffer_id=0)
  step 8: LoadMicroBatch(buffer_id=0) ForwardPass(buffer_id=0)
  step 9: RecvGrad(buffer_id=1) SendActivation(buffer_id=0) BackwardPass(buffer_id=1)
  step 10: LoadMicroBatch(buffer_id=1) ForwardPass(buffer_id=1)
  step 11: RecvGrad(buffer_id=2) SendActivation(buffer_id=1) BackwardPass(buffer_id=2)
  step 12: LoadMicroBatch(buffer_id=2) ForwardPass(buffer_id=2)
  step 13: RecvGrad(buffer_id=3) SendActivation(buffer_id=2) BackwardPass(buffer_id=3)
  step 14: LoadMicroBatch(buffer_id=3) ForwardPass(buffer_id=3)
  step 15: RecvGrad(buffer_id=0) SendActivation(buffer_id=3) BackwardPass(buffer_id=0)
  step 16: (idle)
  step 17: RecvGrad(buffer_id=1) BackwardPass(buffer_id=1)
  step 18: (idle)
  step 19: RecvGrad(buffer_id=2) BackwardPass(buffer_id=2)
  step 20: (idle)
  step 21: RecvGrad(buffer_id=3) BackwardPass(buffer_id=3) ReduceTiedGrads() ReduceGrads() OptimizerStep()" \
  --stages 4 --micro_batches 8 --stage_id 0

expect "eval stage 1 of 2 x 2" "stage 1 (2 pipe buffers):
  step 0: (idle)
  step 1: LoadMicroBatch(buffer_id=0) RecvActivation(buffer_id=0) ForwardPass(buffer_id=0)
  step 2: LoadMicroBatch(buffer_id=1) RecvActivation(buffer_id=1) ForwardPass(buffer_id=1)" \
  --stages 2 --micro_batches 2 --stage_id 1 --eval

# Errors: one line, exit 1 for a value the schedule refuses, 2 for a bad command line.
"$DS_CONFIG" pipe-schedule --stages 2 --micro_batches 2 --stage_id 2 >"$T/out" 2>"$T/err"
rc=$?
[ $rc -eq 1 ] || fail "stage_id out of range: exit $rc, want 1"
grep -qx 'ds_config: error: --stage_id 2 is outside the 2 stages (0..1)' "$T/err" || fail "stage_id: $(cat "$T/err")"
[ ! -s "$T/out" ] || fail "stage_id out of range printed on stdout"
"$DS_CONFIG" pipe-schedule --stages 2 --micro_batches 0 >/dev/null 2>"$T/err"
rc=$?
[ $rc -eq 2 ] || fail "micro_batches 0: exit $rc, want 2"
grep -q '^ds_config: error: --micro_batches' "$T/err" || fail "micro_batches 0: $(cat "$T/err")"

[ $fails -eq 0 ] || exit 1
echo "pipe_schedule_app: all passed"
