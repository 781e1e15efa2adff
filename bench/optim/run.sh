#!/bin/bash
# Optimizer step benchmark: ours vs a STREAM-style kernel with the same access pattern vs
# torch.optim.AdamW(foreach=True), at 10M and 100M parameters on 1 and 2 threads.
# Usage: bench/optim/run.sh [build dir] [extra optim_bench flags]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
shift || true
exec "$build/bench/optim/optim_bench" --sizes 10000000,100000000 --threads 1,2 --repeats 11 \
  --python /usr/bin/python3 "$@"
