"""Compares the per-step loss columns of two train --loss_csv files.

usage: compare_losses.py A.csv B.csv RTOL [FIRST_STEP]
Every step present in both files from FIRST_STEP on must agree: |a-b| <= RTOL * max(1, |a|).
B must contain every step of A from FIRST_STEP on. Prints the worst difference.
"""
import csv
import math
import sys


def read(path):
    with open(path) as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}


a, b = read(sys.argv[1]), read(sys.argv[2])
rtol = float(sys.argv[3])
first = int(sys.argv[4]) if len(sys.argv) > 4 else 1
steps = sorted(s for s in a if s >= first)
if not steps:
    sys.exit(f"FAIL: {sys.argv[1]} has no steps >= {first}")
missing = [s for s in steps if s not in b]
if missing:
    sys.exit(f"FAIL: {sys.argv[2]} lacks steps {missing}")
worst = 0.0
for s in steps:
    if not (math.isfinite(a[s]) and math.isfinite(b[s])):
        sys.exit(f"FAIL: step {s}: non-finite loss {a[s]} vs {b[s]}")
    d = abs(a[s] - b[s]) / max(1.0, abs(a[s]))
    worst = max(worst, d)
    if d > rtol:
        sys.exit(f"FAIL: step {s}: loss {a[s]!r} vs {b[s]!r} (relative difference {d:.3g} > {rtol})")
print(f"ok: {len(steps)} steps agree, worst relative difference {worst:.3g} (tolerance {rtol})")
