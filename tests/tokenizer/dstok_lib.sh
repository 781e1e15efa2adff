# Shared setup of dstok's shell tests (sourced as `source dstok_lib.sh NAME`): DSTOK the
# binary, PY python, T a scratch directory /tmp/ds_dstok_NAME.XXXXXX (removed on exit) holding
# bpe_reference.py's test tokenizers ($T/gpt2, $T/tokenizer.json, ...), fail, and expect.
set -euo pipefail
: "${DS_SOURCE_DIR:?run through ctest (DS_SOURCE_DIR unset)}"
: "${DS_BINARY_DIR:?run through ctest (DS_BINARY_DIR unset)}"
PY=${DS_SYSTEM_PYTHON:-/usr/bin/python3}
DSTOK=$DS_BINARY_DIR/apps/dstok/dstok
[ -x "$DSTOK" ] || { echo "FAIL: $DSTOK not built"; exit 1; }
T=$(mktemp -d "${TMPDIR:-/tmp}/ds_dstok_$1.XXXXXX")
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$PY" "$DS_SOURCE_DIR/tests/tokenizer/bpe_reference.py" "$T" >/dev/null

# expect RC NEEDLE ARGS...: exit RC, stderr one line containing NEEDLE (fixed string).
expect() {
  local want=$1 needle=$2 rc=0
  shift 2
  "$DSTOK" "$@" >"$T/out" 2>"$T/err" </dev/null || rc=$?
  [ "$rc" = "$want" ] || fail "dstok $*: exit $rc, want $want (stderr: $(head -c 300 "$T/err"))"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "dstok $*: stderr is not one line: $(cat "$T/err")"
  grep -qF -- "$needle" "$T/err" || fail "dstok $*: want '$needle' in: $(cat "$T/err")"
}
