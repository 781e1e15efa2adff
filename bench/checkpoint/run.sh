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
awk -v n="$N" -v rep="$REP" '
  function med(k,   i, j, t, c) { c = cnt[k]; for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (v[k, j] < v[k, i]) { t = v[k, i]; v[k, i] = v[k, j]; v[k, j] = t } return v[k, int((c + 1) / 2)] }
  { cnt[$1]++; v[$1, cnt[$1]] = $4 }
  END {
    split("dd_write dd_read dstrain_save dstrain_load dstrain_load_verified torch_save torch_load", ks, " ")
    for (i in ks) g[ks[i]] = med(ks[i])
    printf "%d parameters, %.2f GB per checkpoint (bf16 params + fp32 master + Adam exp_avg, exp_avg_sq); median of %d interleaved repeats\n\n", n, n*14/1e9, rep
    print "| operation | dstrain GB/s | dd GB/s | torch GB/s | dstrain / dd | dstrain / torch |"
    print "| --- | --- | --- | --- | --- | --- |"
    printf "| save (fsync) | %.2f | %.2f (write, conv=fdatasync) | %.2f (torch.save + fsync) | %.0f%% | %.2fx |\n", g["dstrain_save"], g["dd_write"], g["torch_save"], 100*g["dstrain_save"]/g["dd_write"], g["dstrain_save"]/g["torch_save"]
    printf "| load into existing buffers | %.2f | %.2f (read) | %.2f (torch.load) | %.0f%% | %.2fx |\n", g["dstrain_load"], g["dd_read"], g["torch_load"], 100*g["dstrain_load"]/g["dd_read"], g["dstrain_load"]/g["torch_load"]
    printf "| load + CRC-32C verification | %.2f | %.2f (read) | %.2f (torch.load) | %.0f%% | %.2fx |\n", g["dstrain_load_verified"], g["dd_read"], g["torch_load"], 100*g["dstrain_load_verified"]/g["dd_read"], g["dstrain_load_verified"]/g["torch_load"]
  }' "$OUT"
