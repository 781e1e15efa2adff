#!/bin/bash
# Checkpoint save/load throughput: dstrain vs dd (same bytes, same run) vs torch.save/load.
# usage: bench/checkpoint/run.sh BUILD_DIR [N=100000000] [REPEATS=3] [DIR=/tmp/ds_bench_ckpt]
# Prints a markdown table (docs/PERFORMANCE.md "Checkpoint save/load").
set -euo pipefail
BUILD=$1; N=${2:-100000000}; REP=${3:-3}; DIR=${4:-/tmp/ds_bench_ckpt}
BYTES=$((N * 14))
mkdir -p "$DIR"
OUT=$(mktemp)
trap 'rm -rf "$OUT" "$DIR"' EXIT
# dd with the same byte count (16 MiB blocks), write with conv=fdatasync, then read back.
BS=$((16 * 1024 * 1024)); CNT=$(( (BYTES + BS - 1) / BS ))
ddw=(); ddr=()
for i in $(seq "$REP"); do
  ddw+=("$(dd if=/dev/zero of="$DIR/dd.bin" bs=$BS count=$CNT conv=fdatasync 2>&1 | awk '/copied/ {print $(NF-3)}')")
  ddr+=("$(dd if="$DIR/dd.bin" of=/dev/null bs=$BS 2>&1 | awk '/copied/ {print $(NF-3)}')")
  rm -f "$DIR/dd.bin"
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
echo "dd_write $BYTES $(med "${ddw[@]}")" | awk '{printf "%s %s %.3f %.3f\n", $1, $2, $3, $2/$3/1e9}' >>"$OUT"
echo "dd_read $BYTES $(med "${ddr[@]}")" | awk '{printf "%s %s %.3f %.3f\n", $1, $2, $3, $2/$3/1e9}' >>"$OUT"
"$BUILD/bench/checkpoint/bench_checkpoint" "$DIR/ckpt" "$N" "$REP" >>"$OUT"
/usr/bin/python3 "$(dirname "$0")/torch_baseline.py" "$DIR/torch.pt" "$N" "$REP" >>"$OUT"
cat "$OUT" >&2
awk -v n="$N" '
  { t[$1] = $3; g[$1] = $4 }
  END {
    printf "%d parameters, %.2f GB per checkpoint (bf16 params + fp32 master + Adam exp_avg, exp_avg_sq), median of repeats\n\n", n, n*14/1e9
    print "| operation | dstrain GB/s | dd GB/s | torch GB/s | dstrain / dd | dstrain / torch |"
    print "| --- | --- | --- | --- | --- | --- |"
    printf "| save (fsync) | %.2f | %.2f (write, conv=fdatasync) | %.2f (torch.save + fsync) | %.0f%% | %.1fx |\n", g["dstrain_save"], g["dd_write"], g["torch_save"], 100*g["dstrain_save"]/g["dd_write"], g["dstrain_save"]/g["torch_save"]
    printf "| load into existing buffers | %.2f | %.2f (read) | %.2f (torch.load) | %.0f%% | %.1fx |\n", g["dstrain_load"], g["dd_read"], g["torch_load"], 100*g["dstrain_load"]/g["dd_read"], g["dstrain_load"]/g["torch_load"]
    printf "| load + CRC-32C verification | %.2f | %.2f (read) | %.2f (torch.load) | %.0f%% | %.1fx |\n", g["dstrain_load_verified"], g["dd_read"], g["torch_load"], 100*g["dstrain_load_verified"]/g["dd_read"], g["dstrain_load_verified"]/g["torch_load"]
  }' "$OUT"
