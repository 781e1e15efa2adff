#!/usr/bin/env bash
# Install, build, and run the main job on its embedded default:
#   mpirun -np 2 ./build/apps/train/train --config configs/default.json
# Installs only what building and running needs (install_deps.sh --run) and builds only the
# train app; scripts/test.sh installs and builds everything else. Extra arguments go to train.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then bash scripts/install_deps.sh --run; else sudo bash scripts/install_deps.sh --run; fi
# A first configure leaves the tests and benchmarks out (their packages are not installed
# here); an existing build directory keeps its own choice.
cfg=(-DCMAKE_BUILD_TYPE=Release)
[ -f build/CMakeCache.txt ] || cfg+=(-DDS_BUILD_TESTS=OFF -DDS_BUILD_BENCH=OFF)
if ! cmake -S . -B build -G Ninja "${cfg[@]}" >build-configure.log 2>&1; then
  cat build-configure.log >&2
  echo "run_default.sh: error: configure failed (log above, also in build-configure.log)" >&2
  exit 1
fi
cmake --build build -j"$(nproc)" --target train
[ "$(id -u)" = 0 ] && source scripts/mpi_env.sh
exec mpirun -np "${NP:-2}" ./build/apps/train/train --config configs/default.json "$@"
