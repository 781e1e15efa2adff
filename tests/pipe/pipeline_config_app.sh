#!/usr/bin/env bash
# The pipeline section as a user meets it: `ds_config check` shows the pipe x data grid and
# the batch arithmetic per data-parallel group, and a world size that stages does not divide is
# one error line (train itself: pipe_train_app.sh).
source "$(dirname "$0")/../apps/lib.sh"
DS_CONFIG=$DS_BINARY_DIR/apps/ds_config/ds_config
[ -x "$DS_CONFIG" ] || fail "$DS_CONFIG not built"

write_config pipe.json "$CONFIGS/default.json" '
c["train_batch_size"] = 64; c["train_micro_batch_size_per_gpu"] = 2; c.pop("gradient_accumulation_steps", None)
c["pipeline"] = {"stages": 2, "partition_method": "uniform"}'

# 8 ranks, 2 stages: data-parallel size 4, gradient_accumulation_steps 64 / 2 / 4 = 8.
"$DS_CONFIG" check pipe.json --world_size 8 >check.json 2>check.err || fail "check: $(cat check.err)"
grep -qF 'note: pipeline: 2 stages x 4 data-parallel ranks = world size 8; train_batch_size 64 = train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 8 x data-parallel size 4; 8 micro-batches per step through each pipe, partition_method uniform' check.err \
  || fail "check: no grid note: $(cat check.err)"
"$PY" - <<'PYEOF' || fail "check: resolved JSON"
import json
c = json.load(open("check.json"))
assert c["gradient_accumulation_steps"] == 8, c["gradient_accumulation_steps"]
assert c["pipeline"]["stages"] == 2 and c["pipeline"]["partition_method"] == "uniform", c["pipeline"]
PYEOF

rc=0
"$DS_CONFIG" check pipe.json --world_size 5 >/dev/null 2>bad.err || rc=$?
[ $rc -eq 1 ] || fail "world size 5 with 2 stages: exit $rc, want 1"
grep -qxF 'ds_config: error: pipeline grid: the world size 5 is not divisible by pipeline.stages 2 (each stage needs the same number of data-parallel ranks)' bad.err \
  || fail "world size 5: $(cat bad.err)"
# 10 ranks in 2 stages divide; the batch then does not: 64 over a data-parallel size of 5.
rc=0
"$DS_CONFIG" check pipe.json --world_size 10 >/dev/null 2>bad.err || rc=$?
[ $rc -eq 1 ] || fail "train_batch_size 64 over 5 data-parallel ranks: exit $rc, want 1"
grep -qF 'batch sizes do not fit the data-parallel world size 5' bad.err || fail "world size 10: $(cat bad.err)"

echo "pipeline_config_app: all passed"
