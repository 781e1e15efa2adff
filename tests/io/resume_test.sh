#!/bin/bash
# Bit-identical resume: N steps unbroken == k steps + save + NEW process that loads + N-k steps,
# for every working dtype (fp32/fp16/bf16) and ZeRO stage (0-3) at NP ranks.
# usage: resume_test.sh NP [--async]
set -euo pipefail
NP=$1; shift
BIN=$DS_BINARY_DIR/tests/io/ckpt_driver
D=$(mktemp -d /tmp/ds_ckpt_resume.XXXXXX)
trap 'rm -rf "$D"' EXIT
MPI="$DS_MPIEXEC --oversubscribe --bind-to none -np $NP"
$MPI "$BIN" --dir "$D" --steps 6 --save-at 3 "$@"
$MPI "$BIN" --dir "$D" --steps 6 --resume "$@"
