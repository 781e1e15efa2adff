#!/usr/bin/env bash
# cmake --install the build into a temporary prefix, then build and run a user's own project
# against it with find_package(dstrain), under mpirun with 2 ranks; where dstrain was built
# with torch support, also a libtorch program training a torch::nn model through it.
set -euo pipefail
: "${DS_BINARY_DIR:?}" "${DS_SOURCE_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$DS_BINARY_DIR" --prefix "$tmp/prefix" >"$tmp/install.log"
test -f "$tmp/prefix/lib/cmake/dstrain/dstrainConfig.cmake"
test -f "$tmp/prefix/include/ds/engine/engine.h"

consumer() {  # consumer NAME: configure and build tests/install/NAME against the prefix, run it
  local name=$1
  cmake -S "$DS_SOURCE_DIR/tests/install/$name" -B "$tmp/$name" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/$name.configure.log" 2>&1 \
    || { cat "$tmp/$name.configure.log"; exit 1; }
  cmake --build "$tmp/$name" >"$tmp/$name.build.log" 2>&1 || { tail -40 "$tmp/$name.build.log"; exit 1; }
  "${DS_MPIEXEC:-mpirun}" --oversubscribe --bind-to none -np 2 "$tmp/$name/$name"
}

consumer consumer
if [ -f "$tmp/prefix/include/ds/torch/torch_frontend.h" ]; then
  consumer torch_consumer
fi
