#!/usr/bin/env bash
# Install, build, and run the main job on its embedded default:
#   mpirun -np 2 ./build/apps/train/train --config configs/default.json
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" = 0 ]; then bash scripts/install_deps.sh; else sudo bash scripts/install_deps.sh; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)"
[ "$(id -u)" = 0 ] && source scripts/mpi_env.sh
exec mpirun -np "${NP:-2}" ./build/apps/train/train --config configs/default.json "$@"
