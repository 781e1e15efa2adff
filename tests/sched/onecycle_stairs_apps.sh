#!/usr/bin/env bash
# OneCycle stair counts as a user sees them: `ds_config schedule` and the lr column of
# `train --loss_csv` against hand-computed values at every stair edge, in both halves and in
# the decay phase. Step k applies the lr for it = k - 2 (the scheduler steps after each
# optimizer step), so b = (it + 1) mod 15 = (k - 1) mod 15 within the cycle.
source "$(dirname "$0")/../apps/lib.sh"
DS_CONFIG=$DS_BINARY_DIR/apps/ds_config/ds_config
[ -x "$DS_CONFIG" ] || fail "$DS_CONFIG not built"

# Cycle 6 up + 9 down, lr 1e-3 -> 5e-3; 2 stairs up (3 batches each), 3 down (3 each);
# then lr = 1e-3 / (1 + d/5), d = it - 14.
write_config stairs.json "$CONFIGS/default.json" '
c["scheduler"] = {"type": "OneCycle", "params": {
  "cycle_min_lr": 1e-3, "cycle_max_lr": 5e-3,
  "cycle_first_step_size": 6, "cycle_second_step_size": 9,
  "cycle_first_stair_count": 2, "cycle_second_stair_count": 3,
  "decay_step_size": 5, "decay_lr_rate": 1.0, "decay_mom_rate": 0.1}}'

# step -> lr, typed by hand: b = 1..2 -> 0, 3..5 -> 1/2, 6 -> 1 (peak); 7..9 -> 2/3,
# 10..12 -> 1/3, 13..15 -> 0; steps 17..21 decay.
cat > expected.py <<'PYEOF'
expected = {
    1: 1e-3,                                   # construction: min
    2: 1e-3, 3: 1e-3,                          # b = 1, 2: bottom stair
    4: 3e-3, 5: 3e-3, 6: 3e-3,                 # b = 3..5: scale 1/2
    7: 5e-3,                                   # b = 6: peak
    8: 11e-3 / 3, 9: 11e-3 / 3, 10: 11e-3 / 3,  # b = 7..9: scale 2/3
    11: 7e-3 / 3, 12: 7e-3 / 3, 13: 7e-3 / 3,  # b = 10..12: scale 1/3
    14: 1e-3, 15: 1e-3, 16: 1e-3,              # b = 13, 14, 15 (offset 0): scale 0
    17: 1e-3 / 1.2, 18: 1e-3 / 1.4, 19: 1e-3 / 1.6, 20: 1e-3 / 1.8, 21: 5e-4,  # decay
}
PYEOF

# check_lr CSV LR_COLUMN RTOL: every step of `expected` has that lr, and nothing else is there.
check_lr() {
  "$PY" - "$@" <<'PYEOF' || fail "$1: lr differs from the hand-computed OneCycle stairs"
import csv, sys
sys.path.insert(0, ".")
from expected import expected
path, col, rtol = sys.argv[1], sys.argv[2], float(sys.argv[3])
got = {int(r["step"]): float(r[col]) for r in csv.DictReader(open(path))}
assert sorted(got) == sorted(expected), f"{path}: steps {sorted(got)}"
bad = [(k, got[k], v) for k, v in sorted(expected.items()) if abs(got[k] - v) > rtol * v]
for k, g, v in bad:
    print(f"{path}: step {k}: lr {g!r}, expected {v!r}")
sys.exit(1 if bad else 0)
PYEOF
}

"$DS_CONFIG" schedule stairs.json --steps 21 >schedule.csv 2>schedule.err ||
  fail "ds_config schedule exited non-zero: $(cat schedule.err)"
check_lr schedule.csv lr 1e-12

must_run 1 stairs --config stairs.json "${TINY[@]}" --steps 21 --loss_csv train.csv
check_lr train.csv lr 1e-8   # the CSV prints 9 significant digits
echo "PASS"
