#!/usr/bin/env bash
# Every config in configs/ (globbed at test time, so new ones are covered) loads and trains
# a few steps on 2 ranks with a tiny model: exit 0, one finite loss per step, the summary.
# A config with csv_monitor enabled must leave its CSV files behind.
source "$(dirname "$0")/lib.sh"

n=0
for cfg in "$CONFIGS"/*.json; do
  name=$(basename "$cfg" .json)
  mkdir -p "$name" && pushd "$name" >/dev/null
  must_run 2 run --config "$cfg" "${TINY[@]}" --steps 3 --eval_interval 3 --loss_csv loss.csv
  "$PY" - loss.csv "$cfg" <<'PYEOF'
import csv, json, math, os, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert [int(r["step"]) for r in rows] == [1, 2, 3], rows
for r in rows:
    assert math.isfinite(float(r["loss"])), r
cfg = json.load(open(sys.argv[2]))
mon = cfg.get("csv_monitor", {})
if mon.get("enabled"):
    d = os.path.join(mon.get("output_path", ""), mon.get("job_name", "DeepSpeedJobName"))
    files = os.listdir(d) if os.path.isdir(d) else []
    assert any(f.endswith(".csv") for f in files), f"csv_monitor: no CSV files in {d}"
PYEOF
  grep -q '^\[train\] done: 3 steps' run.out || fail "$name: no summary"
  echo "ok: $name"
  popd >/dev/null
  n=$((n + 1))
done
[ "$n" -ge 10 ] || fail "expected at least 10 configs in $CONFIGS, found $n"
echo "PASS ($n configs)"
