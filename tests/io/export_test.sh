#!/bin/bash
# A checkpoint saved at NP ranks, read with /usr/bin/python3 + h5py (checksums, state trees),
# then consolidated by ds_to_fp32 (HDF5 and safetensors) and checked in Python.
# usage: export_test.sh NP COMBO     (COMBO: dtype:stage, e.g. bf16:2)
set -euo pipefail
NP=$1; COMBO=$2
D=$(mktemp -d /tmp/ds_ckpt_export.XXXXXX)
trap 'rm -rf "$D"' EXIT
NAME="${COMBO%%:*}_z${COMBO##*:}"
$DS_MPIEXEC --oversubscribe --bind-to none -np "$NP" "$DS_BINARY_DIR/tests/io/ckpt_driver" \
  --dir "$D" --steps 4 --save-at 2,3 --combos "$COMBO"
CK="$D/$NAME/ckpt"
$DS_SYSTEM_PYTHON "$DS_SOURCE_DIR/tests/io/read_with_h5py.py" "$CK" --expect-client-state
"$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32" "$CK" "$D/out.h5"
"$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32" "$CK" --tag global_step3 "$D/out.safetensors" --format safetensors
$DS_SYSTEM_PYTHON "$DS_SOURCE_DIR/tests/io/check_export.py" "$CK" "$D/out.h5" "$D/out.safetensors"
# errors are one clear line and a non-zero exit
if "$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32" "$CK" --tag nope "$D/x.h5" 2>"$D/err"; then exit 1; fi
grep -q "ds_to_fp32: error: checkpoint tag 'nope' not found" "$D/err"
echo "export_test: OK"
