# Shared helpers for the train app's end-to-end tests (sourced by the test scripts).
# ctest sets DS_SOURCE_DIR, DS_BINARY_DIR, DS_MPIEXEC and the Open MPI root/oversubscribe env.
set -euo pipefail
: "${DS_SOURCE_DIR:?run through ctest (DS_SOURCE_DIR unset)}"
: "${DS_BINARY_DIR:?run through ctest (DS_BINARY_DIR unset)}"
MPIEXEC=${DS_MPIEXEC:-mpirun}
PY=${DS_SYSTEM_PYTHON:-/usr/bin/python3}
TRAIN=$DS_BINARY_DIR/apps/train/train
CONFIGS=$DS_SOURCE_DIR/configs
HERE=$DS_SOURCE_DIR/tests/apps
[ -x "$TRAIN" ] || { echo "FAIL: $TRAIN not built"; exit 1; }

# Tiny model and short outputs: every e2e run takes a second or two.
TINY=(--n_layer 1 --n_head 2 --n_embd 32 --block_size 16 --eval_iters 2 --sample_tokens 16)

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ds_train_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"

fail() { echo "FAIL: $*"; exit 1; }

# run_train NP OUTPREFIX args...: runs train on NP ranks; stdout/stderr in OUTPREFIX.out/.err.
# Returns train's exit status (never exits the script).
run_train() {
  local np=$1 out=$2; shift 2
  local rc=0
  "$MPIEXEC" --oversubscribe --bind-to none -np "$np" "$TRAIN" "$@" >"$out.out" 2>"$out.err" || rc=$?
  return $rc
}

# must_run NP OUTPREFIX args...: run_train that must succeed (prints the logs if not).
must_run() {
  local out=$2
  if ! run_train "$@"; then
    echo "--- stdout ($out) ---"; tail -n 30 "$out.out"; echo "--- stderr ---"; tail -n 30 "$out.err"
    fail "train $* exited non-zero"
  fi
}

# write_config OUT.json BASE.json 'python expression editing dict c'
write_config() {
  "$PY" - "$1" "$2" "$3" <<'PYEOF'
import json, sys
out, base, edit = sys.argv[1:4]
c = json.load(open(base))
exec(edit)
json.dump(c, open(out, "w"), indent=2)
PYEOF
}

# compare_losses A.csv B.csv RTOL [FIRST_STEP]: the loss column of the rows both files share
# (by step, from FIRST_STEP on) agree within relative tolerance RTOL; both must be non-empty.
compare_losses() {
  "$PY" "$HERE/compare_losses.py" "$@"
}
