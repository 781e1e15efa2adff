#!/bin/bash
# ds_to_fp32 never renames its output over something it must not replace: a FIFO or a symlink
# to a device, a file of the checkpoint being read (also through a symlink or "..": the
# checkpoint still converts afterwards), or an existing file without --force.
# usage: export_output_test.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
scratch_dir outguard
TOOL=$TO_FP32
save_small_checkpoint
fail() { echo "export_output_test: FAIL: $*" >&2; exit 1; }
# refused EXPECTED_TEXT ARGS...: ds_to_fp32 exits 1 with "ds_to_fp32: error: ...EXPECTED_TEXT..."
refused() {
  local want=$1; shift
  local rc=0
  "$TOOL" "$@" >"$D/out" 2>"$D/err" || rc=$?
  [ "$rc" = 1 ] || fail "ds_to_fp32 $* exited $rc (want 1): $(cat "$D/err")"
  grep -qF "ds_to_fp32: error: " "$D/err" || fail "no error line for $*: $(cat "$D/err")"
  grep -qF -- "$want" "$D/err" || fail "ds_to_fp32 $*: want '$want', got: $(cat "$D/err")"
}
sums() { find "$CK" -type f -exec sha256sum {} + | sort; }
BEFORE=$(sums)

# 1. not a regular file: a FIFO, a symlink to a character device, a directory
mkfifo "$D/fifo"
refused "OUTPUT $D/fifo is a FIFO, not a regular file" "$CK" "$D/fifo" --force
[ -p "$D/fifo" ] || fail "the FIFO was replaced"
ln -s /dev/null "$D/null_link"
refused "is a character device, not a regular file" "$CK" "$D/null_link" --force
[ -L "$D/null_link" ] || fail "the symlink to /dev/null was replaced"
mkdir "$D/adir"
refused "OUTPUT $D/adir is a directory, not a regular file" "$CK" "$D/adir" --force

# 2. inside the checkpoint directory: directly, via "..", via a symlink, a new file there
refused "lies inside the checkpoint directory" "$CK" "$CK/global_step2/model_states.h5" --force
refused "lies inside the checkpoint directory" "$CK" "$CK/global_step2/../latest" --force
ln -s "$CK/global_step2" "$D/step_link"
refused "lies inside the checkpoint directory" "$CK" "$D/step_link/zero_rank_0.h5" --force
refused "lies inside the checkpoint directory" "$CK" "$CK/out.h5"
[ "$(sums)" = "$BEFORE" ] || fail "the checkpoint changed"
[ ! -e "$CK/out.h5" ] || fail "$CK/out.h5 was written"

# 3. an existing regular file: kept without --force, replaced with it
echo keep > "$D/existing.h5"
refused "OUTPUT $D/existing.h5 already exists; pass --force to replace it" "$CK" "$D/existing.h5"
[ "$(cat "$D/existing.h5")" = keep ] || fail "existing.h5 was replaced without --force"
"$TOOL" "$CK" "$D/existing.h5" --force >/dev/null
[ "$(head -c 4 "$D/existing.h5" | od -An -c | tr -d ' ')" = "211HDF" ] || fail "--force did not write HDF5"
"$TOOL" "$CK" "$D/new.safetensors" --format safetensors >/dev/null
[ -s "$D/new.safetensors" ] || fail "a new OUTPUT was not written"
ls "$D" | grep -q '\.tmp-' && fail "a temporary file was left behind"
echo "export_output_test: OK"
