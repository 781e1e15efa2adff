#!/bin/bash
# Checkpoint save/load throughput: dstrain vs dd (same bytes, same run) vs torch.save/load.
# usage: bench/checkpoint/run.sh BUILD_DIR [N=100000000] [REPEATS=3] [DIR=/tmp/ds_bench_ckpt]
# Each repeat runs dd, dstrain and torch back to back (so they share the disk's state of the
# moment); the table shows medians. Prints a markdown table (docs/user/performance.md).
# `uptime` before each repeat goes to stderr with the raw lines (the machine is shared).
set -euo pipefail
BUILD=$1; N=${2:-100000000}; REP=${3:-3}; DIR=${4:-/tmp/ds_bench_ckpt}
mkdir -p "$DIR"
OUT=$(mktemp)
trap 'rm -rf "$OUT" "$DIR"' EXIT
for i in $(seq "$REP"); do
  echo "# repeat $i: $(uptime)" >&2
  # dd (same byte count, 16 MiB blocks; write with conv=fdatasync, then read back) runs inside
  # bench_checkpoint, right before its save, so that both writes start from the same memory
  # state (bench_checkpoint.cpp explains why that matters on a VM); then dstrain, then torch.
  "$BUILD/bench/checkpoint/bench_checkpoint" "$DIR/ckpt" "$N" 1 --dd >>"$OUT"
  /usr/bin/python3 "$(dirname "$0")/torch_baseline.py" "$DIR/torch.pt" "$N" 1 >>"$OUT"
done
cat "$OUT" >&2
"$(dirname "$0")/table.sh" "$OUT" "$N"
