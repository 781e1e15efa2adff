#!/usr/bin/env bash
# The default config on 2 ranks, with a tiny model: the loss falls (first vs last steps),
# the output has the steps_per_print lines, validation lines, a sample and the summary.
source "$(dirname "$0")/lib.sh"

must_run 2 run --config "$CONFIGS/default.json" "${TINY[@]}" --steps 40 --eval_interval 20 \
  --loss_csv loss.csv
"$PY" - loss.csv <<'PYEOF'
import csv, math, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 40, f"expected 40 rows, got {len(rows)}"
loss = [float(r["loss"]) for r in rows]
assert all(math.isfinite(x) for x in loss), loss
first, last = sum(loss[:3]) / 3, sum(loss[-3:]) / 3
print(f"first 3 steps {first:.4f}, last 3 steps {last:.4f}")
# Byte-level start is near ln 256 = 5.55; unigram statistics alone bring it below 4.
assert first > 4.5, f"initial loss {first} should be near ln(256)=5.55"
assert last < first - 1.0, f"loss did not fall: {first} -> {last}"
val = [float(r["val_loss"]) for r in rows if r["val_loss"]]
assert len(val) >= 2 and all(math.isfinite(v) for v in val), val
PYEOF
grep -Eq 'step=10[ ,]' run.out || fail "no steps_per_print line for step 10 in stdout"
grep -q 'val_loss=' run.out || fail "no validation line"
grep -q '^\[train\] sample' run.out || fail "no generated sample"
grep -q '^\[train\] done: 40 steps' run.out || fail "no summary line"
grep -q 'final validation loss' run.out || fail "no final validation loss in the summary"
if grep -q 'train: error' run.err; then fail "error output on a successful run"; fi
# --progress bar (what a terminal gets): one redrawn line with the bar, no step lines.
must_run 2 bar --config "$CONFIGS/default.json" "${TINY[@]}" --steps 12 --progress bar
grep -q 'step 12/12 \[#*\] 100%' bar.out || fail "no finished progress bar in --progress bar output"
if grep -q '^\[rank 0\] step=' bar.out; then fail "steps_per_print lines in bar mode"; fi
echo "PASS"
