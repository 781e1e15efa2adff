#!/usr/bin/env bash
# Swap-file throughput (NVMe offload): dd with O_DIRECT, then bench_aio (ds::io::AioQueue), on
# the same directory and byte count; medians of 3 each, and ours / dd.
#   bench/aio/run.sh [BUILD_DIR=build] [DIR=/tmp] [BYTES=1073741824] [extra bench_aio flags...]
# The dd commands:
#   dd if=/dev/zero of=F bs=1M count=N oflag=direct      (write)
#   dd if=F of=/dev/null bs=1M iflag=direct              (read)
set -euo pipefail
build=${1:-build}
dir=${2:-/tmp}
bytes=${3:-1073741824}
shift $(( $# < 3 ? $# : 3 ))
exe=$build/bench/aio/bench_aio
[[ -x $exe ]] || { echo "run.sh: error: $exe not built (cmake --build $build --target bench_aio)" >&2; exit 1; }
[[ -d $dir ]] || { echo "run.sh: error: directory $dir does not exist" >&2; exit 1; }
count=$(( (bytes + 1048575) / 1048576 ))
f=$dir/bench_aio_dd.$$
trap 'rm -f "$f"' EXIT
# GB/s (10^9 bytes/s) from dd's "N bytes (...) copied, S s, ..." line.
gbs() { sed -n 's/^\([0-9]*\) bytes.* copied, \([0-9.e+-]*\) s.*/\1 \2/p' | awk '{printf "%.3f\n", $1 / $2 / 1e9}'; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
w=() r=()
for i in 1 2 3; do
  w+=("$(dd if=/dev/zero of="$f" bs=1M count=$count oflag=direct 2>&1 | gbs)")
  r+=("$(dd if="$f" of=/dev/null bs=1M iflag=direct 2>&1 | gbs)")
  echo "dd repeat=$i write_gbs=${w[-1]} read_gbs=${r[-1]}"
done
rm -f "$f"
dw=$(printf '%s\n' "${w[@]}" | median)
dr=$(printf '%s\n' "${r[@]}" | median)
echo "dd write_gbs=$dw read_gbs=$dr (medians of 3; $count MiB, bs=1M, O_DIRECT)"
"$exe" --dir "$dir" --bytes "$bytes" --repeats 3 --dd_write_gbs "$dw" --dd_read_gbs "$dr" "$@"
