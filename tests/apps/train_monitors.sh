#!/usr/bin/env bash
# A Hugging Face-style config through train: its "auto" values filled from --lr and --steps
# with one note each (refused without --lr; an "auto" precision always refused), and the
# tensorboard monitor's event file read back by the tests' own reader (tests/io/tfevents_reader.py):
# DeepSpeed's tags at global samples, the same loss and lr as csv_monitor's rows, the validation
# loss the job printed.
source "$(dirname "$0")/lib.sh"

write_config hf.json "$CONFIGS/default.json" '
c["optimizer"]["params"].update({"lr": "auto", "weight_decay": "auto"})
c["scheduler"]["params"].update({"total_num_steps": "auto", "warmup_num_steps": 2})
c["tensorboard"] = {"enabled": True, "output_path": "mon", "job_name": "tb"}
c["csv_monitor"] = {"enabled": True, "output_path": "mon", "job_name": "csv"}'

# Without --lr: refused, naming the key, where it is and what to pass.
run_train 2 nolr --config hf.json "${TINY[@]}" --steps 8 && fail "an \"auto\" lr without --lr was accepted"
grep -q 'hf.json:[0-9]*:[0-9]*: optimizer.params.lr: "auto" is a placeholder the Hugging Face Trainer fills' nolr.err ||
  fail "no error naming optimizer.params.lr: $(tail -n 3 nolr.err)"
grep -q 'write a number, or pass --lr' nolr.err || fail "the error does not say what to write: $(tail -n 3 nolr.err)"

must_run 2 run --config hf.json "${TINY[@]}" --steps 8 --lr 0.002
grep -q 'config: hf.json:[0-9]*:[0-9]*: optimizer.params.lr: "auto" -> 0.002 (from --lr)' run.out ||
  fail "no note for the lr: $(grep config: run.out)"
grep -q 'scheduler.params.total_num_steps: "auto" -> 8 (from --steps or --epochs)' run.out || fail "no note for total_num_steps"
grep -q 'optimizer.params.weight_decay: "auto" -> 0.0 (dstrain' run.out || fail "no note for weight_decay"

events=(mon/tb/events.out.tfevents.*)
[ ${#events[@]} = 1 ] && [ -s "${events[0]}" ] || fail "expected one event file in mon/tb, got: ${events[*]}"
final_val=$(sed -n 's/.*final validation loss \([0-9.]*\).*/\1/p' run.out)
[ -n "$final_val" ] || fail "no final validation loss in the output"
PYTHONPATH="$DS_SOURCE_DIR/tests/io" "$PY" - "${events[0]}" mon/csv/train.csv "$final_val" <<'PYEOF'
import csv, math, sys
from tfevents_reader import scalars
got = scalars(sys.argv[1])
rows = list(csv.DictReader(open(sys.argv[2])))
assert len(rows) == 8, rows
by = {}
for step, tag, value in got:
    by.setdefault(tag, {})[step] = value
assert set(by) == {"Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/samples_per_sec",
                   "Train/Samples/eval_loss"}, set(by)
# The validation loss at the samples of the step it followed: the last one is the final one printed.
last_samples = int(rows[-1]["samples"])
assert set(by["Train/Samples/eval_loss"]) <= {int(r["samples"]) for r in rows}, by["Train/Samples/eval_loss"]
assert abs(by["Train/Samples/eval_loss"][last_samples] - float(sys.argv[3])) <= 5e-5, (by["Train/Samples/eval_loss"], sys.argv[3])
for r in rows:
    samples = int(r["samples"])
    for tag, col in (("Train/Samples/train_loss", "loss"), ("Train/Samples/lr", "lr")):
        v = by[tag][samples]
        assert math.isclose(v, float(r[col]), rel_tol=1e-6), (tag, samples, v, r[col])
assert len(by["Train/Samples/samples_per_sec"]) == 7 and min(by["Train/Samples/samples_per_sec"].values()) > 0
print("tensorboard: %d scalars at samples %s, loss and lr as in train.csv" % (len(got), sorted(by["Train/Samples/lr"])))
PYEOF
[ $? = 0 ] || fail "the event file does not match"

# An "auto" precision is never chosen for the user.
write_config fp16auto.json "$CONFIGS/default.json" 'c["fp16"] = {"enabled": "auto"}'
run_train 1 prec --config fp16auto.json "${TINY[@]}" --steps 2 && fail "fp16.enabled \"auto\" was accepted"
grep -q 'fp16.enabled: "auto" is a placeholder' prec.err || fail "no error naming fp16.enabled: $(tail -n 3 prec.err)"
echo "PASS"
