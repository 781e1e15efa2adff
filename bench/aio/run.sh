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
source "$(dirname "$0")/../common/dd_direct.sh"
trap 'rm -f "$dir/dd_direct.$$"' EXIT
dd_direct "$dir" "$count"
dw=$DD_WRITE_GBS dr=$DD_READ_GBS
"$exe" --dir "$dir" --bytes "$bytes" --repeats 3 --dd_write_gbs "$dw" --dd_read_gbs "$dr" "$@"
