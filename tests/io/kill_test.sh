#!/bin/bash
# SIGKILL during a save (test hook DS_CKPT_TEST_KILL_AT=<phase>[@rank]), then a new job loads:
# the previous checkpoint (or the new one, once `latest` moved) loads and training resumes
# bit-identically to an unbroken run. usage: kill_test.sh NP
set -uo pipefail
NP=$1
BIN=$DS_BINARY_DIR/tests/io/ckpt_driver
ROOT=$(mktemp -d /tmp/ds_ckpt_kill.XXXXXX)
trap 'rm -rf "$ROOT"' EXIT
MPI="$DS_MPIEXEC --oversubscribe --bind-to none -np $NP"
COMBO=bf16:2
$MPI "$BIN" --dir "$ROOT/ref" --steps 6 --combos $COMBO || { echo "reference run failed"; exit 1; }
fail=0
for phase in begin shard_write shard_write@1 before_manifest before_rename before_latest after_latest; do
  D="$ROOT/$phase"
  $MPI "$BIN" --dir "$D" --steps 6 --save-at 2,4 --combos $COMBO --kill "$phase" >"$ROOT/$phase.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then echo "$phase: the job was not killed"; fail=1; continue; fi
  cp "$ROOT/ref/bf16_z2/full.txt" "$D/bf16_z2/full.txt" 2>/dev/null || { mkdir -p "$D/bf16_z2"; cp "$ROOT/ref/bf16_z2/full.txt" "$D/bf16_z2/"; }
  latest=$(cat "$D/bf16_z2/ckpt/latest")
  want=global_step2; [ "$phase" = after_latest ] && want=global_step4
  if [ "$latest" != "$want" ]; then echo "$phase: latest is '$latest', expected $want"; fail=1; continue; fi
  out=$($MPI "$BIN" --dir "$D" --steps 6 --resume --combos $COMBO 2>&1) || { echo "$phase: resume failed: $out"; fail=1; continue; }
  echo "killed at $phase (rc $rc), latest=$latest: $out"
done
exit $fail
