#!/usr/bin/env bash
# Every CPU benchmark back to back, for the figures in docs/user/performance.md
# (dated runs: bench/results/).
# Run it on an idle machine: each benchmark is a ratio against a reference measured in the
# same run, but other work on the same cores moves the two sides differently.
#
#   bench/run_all.sh [BUILD_DIR=build] [OUT_DIR=bench-results]
#
# Writes OUT_DIR/<bench>.txt (and the load average before each) and prints where they are.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
out=${2:-$root/bench-results}
mkdir -p "$out"
cd "$root"
source scripts/mpi_env.sh

cmake --build "$build" --target comm_bench optim_bench bench_train bench_train_engine zero_bench \
  page_release_bench bench_checkpoint train

run() {  # run NAME CMD...: one benchmark, its output and the load before it
  local name=$1
  shift
  echo "== $name ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$out/$name.txt"
  "$@" 2>&1 | tee -a "$out/$name.txt"
}

run default_train bash -c "time mpirun -np 2 '$build/apps/train/train' --config configs/default.json 2>&1 | tail -3"
for np in 2 4; do
  run "comm_np$np" mpirun -np "$np" --bind-to none "$build/bench/comm/comm_bench" --warmup 1 --budget 0.2
done
run optim bash bench/optim/run.sh "$build"
run train bash bench/train/run.sh "$build"
run zero bash bench/zero/run.sh "$build"
run checkpoint bash bench/checkpoint/run.sh "$build"
echo "run_all: results in $out"
