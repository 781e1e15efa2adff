#!/usr/bin/env bash
# Real single-node Slurm: start munge/slurmctld/slurmd (scripts/slurm-up.sh), submit
# slurm/train.sbatch (srun --mpi=pmix), slurm/train-mpirun.sbatch and slurm/train-dsrun.sbatch
# with `sbatch --wait`, check each job's output and exit state, stop the daemons (trap).
# The program is DS_TRAIN (default: the launcher's MPI hello test program); with
# DS_SLURM_REAL_TRAIN=1 and apps/train built, the real train app runs a few steps.
# Exit 77 (ctest SKIP_RETURN_CODE) when Slurm is not installed or cannot run here.
set -euo pipefail
SRC=${DS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
BIN=${DS_BINARY_DIR:?DS_BINARY_DIR}
for tool in munged slurmctld slurmd sbatch srun sinfo; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not installed"; exit 77; }
done
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root (slurmd as root without systemd)"; exit 77; }
# dsrun takes the allocation only without a hostfile; a hostfile named with --hostfile must
# exist, so the default path has to be absent here.
[ ! -e /job/hostfile ] || { echo "SKIP: /job/hostfile exists (dsrun would use it)"; exit 77; }

export SLURM_CI_DIR
SLURM_CI_DIR=$(mktemp -d /tmp/slurm-ci.XXXXXX)
export SLURM_CI_CPUS=4
# Private ports so a concurrent Slurm test on this machine does not collide.
export SLURM_CI_CTLD_PORT=$((20000 + ($$ % 10000) * 2)) SLURM_CI_SLURMD_PORT=$((20001 + ($$ % 10000) * 2))
cleanup() {
  bash "$SRC/scripts/slurm-down.sh" || true
  rm -rf "$SLURM_CI_DIR"
}
trap cleanup EXIT
if ! bash "$SRC/scripts/slurm-up.sh" > "$SLURM_CI_DIR/up.log" 2>&1; then
  cat "$SLURM_CI_DIR/up.log"
  echo "FAIL: slurm did not start"
  exit 1
fi
export SLURM_CONF=$SLURM_CI_DIR/slurm.conf
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

HELLO=$BIN/tests/launcher/ds_launch_hello
mode=${1:-hello}
if [ "$mode" = train ]; then
  export DS_TRAIN=$BIN/apps/train/train DS_CONFIG=${DS_CONFIG:-configs/default.json}
  export DS_TRAIN_ARGS="--steps 2 --eval_iters 0 --n_layer 1 --sample_tokens 0"
else
  export DS_TRAIN=$HELLO DS_CONFIG=configs/default.json DS_TRAIN_ARGS="extra arg"
fi
export DS_DSRUN=$BIN/apps/dsrun/dsrun
no_hf=""  # no --hostfile: the default path is absent (checked above), so the allocation is used

n=2
status=0
# train-dsrun.sbatch runs twice: dsrun -> mpirun (default) and dsrun -> srun (--launcher slurm).
for job in train.sbatch train-mpirun.sbatch train-dsrun.sbatch train-dsrun.sbatch:srun; do
  script=${job%%:*}
  out=$SLURM_CI_DIR/${job/:/-}.out
  export DS_DSRUN_ARGS="$no_hf"
  [ "$job" = train-dsrun.sbatch:srun ] && DS_DSRUN_ARGS="$no_hf --launcher slurm --launcher_args --mpi=pmix"
  rc=0
  (cd "$SRC" && sbatch --wait -n $n -o "$out" "slurm/$script") > "$SLURM_CI_DIR/sbatch.log" 2>&1 || rc=$?
  jobid=$(grep -o 'Submitted batch job [0-9]*' "$SLURM_CI_DIR/sbatch.log" | awk '{print $4}')
  state=$(scontrol show job "$jobid" 2>/dev/null | grep -o 'JobState=[A-Z]*' || true)
  echo "== $job: job $jobid rc=$rc $state"
  cat "$out" || true
  if [ "$rc" != 0 ]; then
    echo "FAIL: $script exited $rc"; status=1; continue
  fi
  if [ "$mode" = train ]; then
    grep -q "done: 2 steps" "$out" || { echo "FAIL: $job: train did not finish"; status=1; }
    continue
  fi
  for r in $(seq 0 $((n - 1))); do
    if ! grep -q "^hello rank=$r size=$n sum=3 expect=3 " "$out"; then
      echo "FAIL: $script: no correct line for rank $r"; status=1
    fi
  done
  # Which engine started the ranks: srun (a step, no Open MPI rank variables) or mpirun.
  case $job in
    train.sbatch|*:srun) engine="OMPI_COMM_WORLD_RANK=- SLURM_STEP_ID=[0-9]" ;;
    *) engine="OMPI_COMM_WORLD_RANK=1 " ;;
  esac
  grep -q "^hello rank=1 .* $engine" "$out" || { echo "FAIL: $job: not started by the expected engine"; status=1; }
  # dsrun adds DeepSpeed's variables; srun and mpirun alone do not.
  if [ "$script" = train-dsrun.sbatch ]; then
    grep -q "RANK=1 LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_SIZE=2 CROSS_RANK=0 CROSS_SIZE=1 MASTER_ADDR=localhost .*args=--local_rank=1|--config|configs/default.json|extra|arg" "$out" \
      || { echo "FAIL: dsrun variables"; status=1; }
  else
    grep -q "args=--config|configs/default.json|extra|arg$" "$out" || { echo "FAIL: $script args"; status=1; }
  fi
done
# A failing job reports its exit code through sbatch --wait.
rc=0
(cd "$SRC" && DS_TRAIN=/bin/false sbatch --wait -n 1 -o "$SLURM_CI_DIR/false.out" slurm/train.sbatch) > /dev/null 2>&1 || rc=$?
[ "$rc" != 0 ] || { echo "FAIL: a failing job returned 0"; status=1; }
echo "failing job: sbatch --wait rc=$rc"
[ $status = 0 ] && echo "PASS slurm ($mode)"
exit $status
