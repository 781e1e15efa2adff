#!/bin/bash
# Checkpoint save/load throughput: dstrain vs dd (same bytes, same run) vs torch.save/load.
# usage: bench/checkpoint/run.sh BUILD_DIR [N=100000000] [REPEATS=3] [DIR=/tmp/ds_bench_ckpt]
# Each repeat runs dd, dstrain and torch back to back (so they share the disk's state of the
# moment); the table shows medians. Prints a markdown table (docs/PERFORMANCE.md).
set -euo pipefail
BUILD=$1; N=${2:-100000000}; REP=${3:-3}; DIR=${4:-/tmp/ds_bench_ckpt}
BYTES=$((N * 14))
mkdir -p "$DIR"
OUT=$(mktemp)
trap 'rm -rf "$OUT" "$DIR"' EXIT
BS=$((16 * 1024 * 1024)); CNT=$(( (BYTES + BS - 1) / BS ))
for i in $(seq "$REP"); do
  # dd with the same byte count (16 MiB blocks): write with conv=fdatasync, then read back.
  w=$(dd if=/dev/zero of="$DIR/dd.bin" bs=$BS count=$CNT conv=fdatasync 2>&1 | awk '/copied/ {print $(NF-3)}')
  r=$(dd if="$DIR/dd.bin" of=/dev/null bs=$BS 2>&1 | awk '/copied/ {print $(NF-3)}')
  rm -f "$DIR/dd.bin"
  awk -v b="$BYTES" -v w="$w" -v r="$r" 'BEGIN {printf "dd_write %d %.3f %.3f\ndd_read %d %.3f %.3f\n", b, w, b/w/1e9, b, r, b/r/1e9}' >>"$OUT"
  "$BUILD/bench/checkpoint/bench_checkpoint" "$DIR/ckpt" "$N" 1 >>"$OUT"
  /usr/bin/python3 "$(dirname "$0")/torch_baseline.py" "$DIR/torch.pt" "$N" 1 >>"$OUT"
done
cat "$OUT" >&2
"$(dirname "$0")/table.sh" "$OUT" "$N"
