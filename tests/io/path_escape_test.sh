#!/bin/bash
# ds_to_fp32 reads only inside the checkpoint directory: --tag ../x, and a `latest` naming
# ../x or an absolute path, are refused with one error line naming the value, even where
# that path holds a valid checkpoint.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
scratch_dir escape
save_small_checkpoint
cp -r "$CK/global_step2" "$D/outside"
EXPORT=$TO_FP32
expect_refused() {  # WHAT PATTERN args...
  local what=$1 pattern=$2; shift 2
  if "$EXPORT" "$@" "$D/x.h5" 2>"$D/err"; then echo "FAIL: $what: exited 0"; exit 1; fi
  grep -qF -- "$pattern" "$D/err" || { cat "$D/err"; echo "FAIL: $what: no '$pattern'"; exit 1; }
  [ ! -e "$D/x.h5" ] || { echo "FAIL: $what: wrote an output"; exit 1; }
  echo "ok: $what: $(head -1 "$D/err")"
}
expect_refused "--tag ../../outside" "checkpoint tag '../../outside' is not a plain directory name" "$CK" --tag ../../outside
expect_refused "--tag absolute" "checkpoint tag '$D/outside' is not a plain directory name" "$CK" --tag "$D/outside"
printf '../../outside' > "$CK/latest"
expect_refused "latest ../" "$CK/latest names tag '../../outside'" "$CK"
printf '%s' "$D/outside" > "$CK/latest"
expect_refused "latest absolute" "$CK/latest names tag '$D/outside'" "$CK"
printf 'global_step2' > "$CK/latest"
"$EXPORT" "$CK" "$D/ok.h5" >/dev/null
echo "path_escape_test: OK"
