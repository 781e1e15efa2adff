#!/bin/bash
# Two jobs (two mpiruns of ckpt_driver) save the same tag into one directory at the same time,
# a few rounds: exactly one job commits; the other fails, naming the other writer (or, when it
# checked after that commit, the existing tag); the committed checkpoint loads bit for bit and
# `latest` names it. Rounds with --async --meet begin both saves (tag checked) before either
# commits, so the commits race every round; rounds without them race as they come.
set -uo pipefail
source "$(dirname "$0")/lib.sh"
scratch_dir concurrent
fail=0

# round NAME FLAGS...: the two jobs, then the checks.
round() {
  local name=$1 meet=no
  shift
  [ $# -gt 0 ] && meet=yes
  local R="$D/$name"
  mkdir -p "$R" "$R.a.ompi" "$R.b.ompi"
  # Each mpirun its own session directory: two started at once race to create a shared one.
  OMPI_MCA_orte_tmpdir_base="$R.a.ompi" $MPIRUN -np 1 "$CKPT_DRIVER" --dir "$R" --steps 2 --save-at 2 \
    --combos fp32:0 "$@" >"$R.a.log" 2>&1 &
  local pid_a=$!
  OMPI_MCA_orte_tmpdir_base="$R.b.ompi" $MPIRUN -np 1 "$CKPT_DRIVER" --dir "$R" --steps 2 --save-at 2 \
    --combos fp32:0 "$@" >"$R.b.log" 2>&1 &
  local pid_b=$!
  wait $pid_a
  local rc_a=$?
  wait $pid_b
  local rc_b=$?
  local loser
  if [ $rc_a -eq 0 ] && [ $rc_b -ne 0 ]; then
    loser=$R.b.log
  elif [ $rc_b -eq 0 ] && [ $rc_a -ne 0 ]; then
    loser=$R.a.log
  else
    echo "$name: exit codes $rc_a and $rc_b: exactly one job must commit"
    cat "$R.a.log" "$R.b.log"
    fail=1
    return
  fi
  local want="was committed by another writer \(pid [0-9]+ on host |already exists"
  [ "$meet" = yes ] && want="was committed by another writer \(pid [0-9]+ on host "
  if ! grep -Eq "$want" "$loser"; then
    echo "$name: the failed job does not say why:"
    cat "$loser"
    fail=1
    return
  fi
  local latest
  latest=$(cat "$R/fp32_z0/ckpt/latest")
  if [ "$latest" != global_step2 ]; then
    echo "$name: latest is '$latest'"
    fail=1
    return
  fi
  # The committed checkpoint is whole: a new job loads it and finds the winner's parameters.
  if ! out=$($MPIRUN -np 1 "$CKPT_DRIVER" --dir "$R" --steps 2 --resume --combos fp32:0 2>&1); then
    echo "$name: the committed checkpoint does not load: $out"
    fail=1
    return
  fi
  echo "$name: one job committed; the other: $(grep -Eo "($want)[^;]*" "$loser" | head -1)"
}

for i in 1 2 3; do round "met$i" --async --meet "$D/meet$i"; done
for i in 1 2 3; do round "free$i"; done
exit $fail
