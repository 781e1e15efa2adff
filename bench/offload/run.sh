#!/usr/bin/env bash
# NVMe offload's optimizer step against dd on the same directory, in one run.
#   bench/offload/run.sh [BUILD_DIR=build] [DIR=/tmp] [ELEMENTS=134217728] [extra nvme_step_bench flags...]
# dd moves the bytes one step reads and writes (3 x 4 x ELEMENTS, split in 1 MiB blocks):
#   dd if=/dev/zero of=F bs=1M count=N oflag=direct      (write)
#   dd if=F of=/dev/null bs=1M iflag=direct              (read)
# medians of 3 each; then nvme_step_bench steps AdamW through the swap files (median of its steps).
set -euo pipefail
build=${1:-build}
dir=${2:-/tmp}
elements=${3:-134217728}
shift $(( $# < 3 ? $# : 3 ))
exe=$build/bench/offload/nvme_step_bench
[[ -x $exe ]] || { echo "run.sh: error: $exe not built (cmake --build $build --target nvme_step_bench)" >&2; exit 1; }
[[ -d $dir ]] || { echo "run.sh: error: directory $dir does not exist" >&2; exit 1; }
count=$(( (12 * elements + 1048575) / 1048576 ))
f=$dir/nvme_step_dd.$$
trap 'rm -f "$f"' EXIT
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
"$exe" --dir "$dir" --elements "$elements" --dd_write_gbs "$dw" --dd_read_gbs "$dr" "$@"
