#!/usr/bin/env bash
# cmake --install the build into a temporary prefix, then build and run a user's own project
# against it with find_package(dstrain), under mpirun with 2 ranks.
set -euo pipefail
: "${DS_BINARY_DIR:?}" "${DS_SOURCE_DIR:?}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$DS_BINARY_DIR" --prefix "$tmp/prefix" >"$tmp/install.log"
test -f "$tmp/prefix/lib/cmake/dstrain/dstrainConfig.cmake"
test -f "$tmp/prefix/include/ds/engine/engine.h"
cmake -S "$DS_SOURCE_DIR/tests/install/consumer" -B "$tmp/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 \
  || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/build" >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
"${DS_MPIEXEC:-mpirun}" --oversubscribe --bind-to none -np 2 "$tmp/build/consumer"
