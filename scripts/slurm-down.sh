#!/usr/bin/env bash
# Stop what scripts/slurm-up.sh started (slurmd, slurmctld, and munged only if it started
# it), by PID from the pid files in $SLURM_CI_DIR, and wait until they are gone.
SLURM_CI_DIR=${SLURM_CI_DIR:-/tmp/slurm-ci}
pids=()
for f in "$SLURM_CI_DIR/slurmd.pid" "$SLURM_CI_DIR/slurmctld.pid" "$SLURM_CI_DIR/munged.pid"; do
  if [ -s "$f" ]; then
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" && pids+=("$pid")
    fi
  fi
done
for _ in $(seq 1 100); do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [ $alive = 0 ] && break
  sleep 0.1
done
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && kill -KILL "$p"; done
rm -f "$SLURM_CI_DIR/slurmd.pid" "$SLURM_CI_DIR/slurmctld.pid" "$SLURM_CI_DIR/munged.pid"
echo "slurm down (${pids[*]:-none})"
