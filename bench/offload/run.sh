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
source "$(dirname "$0")/../common/dd_direct.sh"
trap 'rm -f "$dir/dd_direct.$$"' EXIT
dd_direct "$dir" "$count"
dw=$DD_WRITE_GBS dr=$DD_READ_GBS
"$exe" --dir "$dir" --elements "$elements" --dd_write_gbs "$dw" --dd_read_gbs "$dr" "$@"
