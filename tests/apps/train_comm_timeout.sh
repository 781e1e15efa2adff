#!/usr/bin/env bash
# A stopped rank (SIGSTOP, as a hung process or a dead node looks to its peers) must not hang
# the job: with communication.timeout = 2 s, the train app on 2 ranks ends non-zero within a
# bounded time, and rank 0 prints one line naming the collective, its sequence number and
# the rank that did not arrive.
source "$(dirname "$0")/lib.sh"

RANK_PIDS=()
# Ranks left over are ours: continue and kill them by pid, after checking the pid still runs
# the train app (not a reused pid).
cleanup() {
  local p
  for p in "${RANK_PIDS[@]}"; do
    if { tr '\0' ' ' < /proc/"$p"/cmdline; } 2>/dev/null | grep -q 'apps/train/train'; then
      kill -CONT "$p" 2>/dev/null || true
      kill -KILL "$p" 2>/dev/null || true
    fi
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

# No scheduler (its total_num_steps would cap the run): the job runs until stopped.
write_config cfg.json "$CONFIGS/default.json" \
  'c.pop("scheduler"); c["steps_per_print"] = 1; c.setdefault("communication", {})["timeout"] = 2'
"$MPIEXEC" --oversubscribe --bind-to none -np 2 "$TRAIN" --config cfg.json "${TINY[@]}" \
  --steps 1000000 --eval_interval 0 > run.out 2> run.err &
mpid=$!

# Bounded waits by polling, not timed sleeps.
for i in $(seq 1 600); do
  grep -q 'step=3[ ,]' run.out 2>/dev/null && break
  kill -0 "$mpid" 2>/dev/null || { cat run.out run.err; fail "train ended before step 3"; }
  sleep 0.1
done
grep -q 'step=3[ ,]' run.out || { cat run.out run.err; fail "train did not reach step 3 in 60 s"; }

# The ranks are mpirun's children; rank 1 is the one whose environment says so.
rank1=""
for p in $(ps -o pid= --ppid "$mpid"); do
  RANK_PIDS+=("$p")
  if tr '\0' '\n' < /proc/"$p"/environ 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then rank1=$p; fi
done
[ -n "$rank1" ] || fail "rank 1 not found among mpirun's children (${RANK_PIDS[*]})"
start=$(date +%s)
kill -STOP "$rank1"

for i in $(seq 1 600); do
  kill -0 "$mpid" 2>/dev/null || break
  sleep 0.1
done
if kill -0 "$mpid" 2>/dev/null; then
  tail -5 run.out; cat run.err
  kill -TERM "$mpid" 2>/dev/null || true
  fail "the job still runs 60 s after rank 1 stopped (no collective deadline)"
fi
rc=0
wait "$mpid" || rc=$?
took=$(( $(date +%s) - start ))
cat run.err
[ "$rc" != 0 ] || fail "the job exited 0 although rank 1 was stopped"
grep -Eq 'comm timeout: rank 0 waited [0-9]+ s in collective [a-z_]+ #[0-9]+ \(limit 2 s' run.err \
  || fail "no 'comm timeout' line from rank 0"
# Rank 1 is named either as not arrived (stopped before the collective) or, when the stop
# caught it inside one, as arrived but stopped.
grep -Eq "ranks that did not arrive: 1 \(at #|ranks that arrived but cannot progress: 1 \(pid $rank1, stopped\)" run.err \
  || fail "the timeout line does not name rank 1"
echo "job ended rc=$rc ${took}s after rank 1 stopped"
echo "PASS"
