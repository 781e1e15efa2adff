#!/bin/bash
# ds_to_fp32 verifies what load_checkpoint verifies, also when the output comes from the fp32
# master in the shards alone: a truncated or corrupt model_states.h5 is an error naming the
# file (exit 1), no OUTPUT and no temporary file are left.
# usage: export_bad_input_test.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
scratch_dir export_bad
TOOL=$TO_FP32
save_small_checkpoint
M="$CK/global_step2/model_states.h5"
cp "$M" "$D/pristine.h5"
fail() { echo "export_bad_input_test: FAIL: $*" >&2; exit 1; }
# refused EXPECTED_TEXT: ds_to_fp32 CK OUT exits 1 with one "ds_to_fp32: error: ..." naming EXPECTED_TEXT
refused() {
  local rc=0
  "$TOOL" "$CK" "$D/out.h5" >"$D/out" 2>"$D/err" || rc=$?
  [ "$rc" = 1 ] || fail "exit $rc (want 1): $(cat "$D/err") $(cat "$D/out")"
  grep -qF "ds_to_fp32: error: " "$D/err" || fail "no error line: $(cat "$D/err")"
  grep -qF -- "$1" "$D/err" || fail "want '$1', got: $(cat "$D/err")"
  [ ! -e "$D/out.h5" ] || fail "out.h5 was written"
  ! ls "$D" | grep -q '\.tmp-' || fail "a temporary file was left behind"
}
# 1. truncated model file
$DS_SYSTEM_PYTHON -c "import os,sys; p=sys.argv[1]; os.truncate(p, os.path.getsize(p)//2)" "$M"
refused "$M: H5F__super_read: truncated file"
cp "$D/pristine.h5" "$M"
# 2. one flipped byte inside a parameter's data
flip_byte "$M" params/l1.weight
refused "checksum mismatch in $M dataset 'params/l1.weight'"
cp "$D/pristine.h5" "$M"
# 3. the intact checkpoint converts
"$TOOL" "$CK" "$D/out.h5" >/dev/null || fail "the intact checkpoint did not convert"
echo "export_bad_input_test: OK"
