#!/bin/bash
# Elastic load: saved on N ranks (ZeRO 1/2/3), resumed on M ranks with the same global batch;
# the loss curve and final parameters must match the unbroken N-rank run within a relative
# tolerance (fp32: 1e-4; bf16: 2e-2) -- only the order of the gradient sums differs.
# usage: elastic_test.sh N M
set -euo pipefail
N=$1; M=$2
BIN=$DS_BINARY_DIR/tests/io/ckpt_driver
D=$(mktemp -d /tmp/ds_ckpt_elastic.XXXXXX)
trap 'rm -rf "$D"' EXIT
MPIRUN="$DS_MPIEXEC --oversubscribe --bind-to none"
$MPIRUN -np "$N" "$BIN" --dir "$D" --steps 6 --save-at 3 --combos fp32:1,fp32:2,fp32:3
$MPIRUN -np "$M" "$BIN" --dir "$D" --steps 6 --resume --combos fp32:1,fp32:2,fp32:3 --tol 1e-4
D2=$(mktemp -d /tmp/ds_ckpt_elastic.XXXXXX)
trap 'rm -rf "$D" "$D2"' EXIT
$MPIRUN -np "$N" "$BIN" --dir "$D2" --steps 6 --save-at 3 --combos bf16:2,bf16:3
$MPIRUN -np "$M" "$BIN" --dir "$D2" --steps 6 --resume --combos bf16:2,bf16:3 --tol 2e-2
