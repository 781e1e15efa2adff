#!/usr/bin/env bash
# Resume continues exactly: an unbroken 8-step run that saves at steps 4 and 8, then a run
# loaded from the step-4 checkpoint; steps 5-8 must repeat the unbroken run's losses
# (tolerance 1e-6 relative: same parameters, optimizer state, scheduler, sampler position).
# Also: --load_dir without --ckpt_id takes <dir>/latest (step 8), so --steps 10 runs 9-10.
source "$(dirname "$0")/lib.sh"

must_run 2 full --config "$CONFIGS/default.json" "${TINY[@]}" --steps 8 --save_dir ckpt \
  --save_interval 4 --loss_csv full.csv
[ -d ckpt/global_step4 ] || fail "no checkpoint ckpt/global_step4 (saves: $(ls ckpt))"
[ "$(cat ckpt/latest)" = global_step8 ] || fail "ckpt/latest is '$(cat ckpt/latest)', expected global_step8"

must_run 2 resumed --config "$CONFIGS/default.json" "${TINY[@]}" --steps 8 --load_dir ckpt \
  --ckpt_id global_step4 --loss_csv resumed.csv
"$PY" - resumed.csv <<'PYEOF'
import csv, sys
steps = [int(r["step"]) for r in csv.DictReader(open(sys.argv[1]))]
assert steps == [5, 6, 7, 8], f"resumed run should run steps 5-8, ran {steps}"
PYEOF
compare_losses resumed.csv full.csv 1e-6 5
grep -q 'resumed from' resumed.out || fail "no resume message"

must_run 2 latest --config "$CONFIGS/default.json" "${TINY[@]}" --steps 10 --load_dir ckpt \
  --loss_csv latest.csv
"$PY" - latest.csv <<'PYEOF'
import csv, sys
steps = [int(r["step"]) for r in csv.DictReader(open(sys.argv[1]))]
assert steps == [9, 10], f"run from latest should run steps 9-10, ran {steps}"
PYEOF
# Saved on 2 ranks, resumed on 1 (the engine re-partitions; the sampler keeps its place in
# the epoch): runs steps 5-8 with losses within 2% of the unbroken run (other samples).
must_run 1 one --config "$CONFIGS/default.json" "${TINY[@]}" --steps 8 --load_dir ckpt \
  --ckpt_id global_step4 --loss_csv one.csv
grep -q 'note: the checkpoint was saved with 32 sequences per micro-step, this run has 16' one.out \
  || fail "no note about the changed world size"
compare_losses one.csv full.csv 0.02 5
# --steps below the checkpoint's step: a warning on stderr, nothing trained, exit 0, the
# checkpoint untouched.
before=$(cat ckpt/latest)
must_run 1 below --config "$CONFIGS/default.json" "${TINY[@]}" --steps 3 --load_dir ckpt --save_dir ckpt
grep -q "train: warning: the checkpoint is at step 8, past this run's last step 3" below.err \
  || { cat below.err; fail "no warning for --steps below the checkpoint's step"; }
grep -q '\[train\] done: 0 steps$' below.out || { tail -n 3 below.out; fail "below: not 'done: 0 steps'"; }
[ "$(cat ckpt/latest)" = "$before" ] || fail "below: latest changed from $before to $(cat ckpt/latest)"
echo "PASS"
