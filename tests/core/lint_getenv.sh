#!/bin/bash
# Every environment read goes through the registry (ds/core/env.h): no getenv( in the product's
# code (src/, mpi/, io/, apps/) outside src/core/src/env.cpp, which implements the typed
# getters and env::external() for variables other programs set. dsrun hands the users'
# variables on from the `environ` array (mpi/launch works on that copy), not through getenv.
# usage: lint_getenv.sh
set -uo pipefail
cd "${DS_SOURCE_DIR:?run through ctest}"
allowed='^src/core/src/env\.cpp:'
hits=$(grep -rnE --include='*.cpp' --include='*.cc' --include='*.h' --include='*.hpp' --include='*.cu' \
         --include='*.cuh' '(^|[^A-Za-z0-9_])(secure_)?getenv[[:space:]]*\(' src mpi io apps |
       grep -vE "$allowed" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//')
if [ -n "$hits" ]; then
  echo "FAIL: getenv( outside the env registry; read DS_* variables with ds::env::get_* (add a row to"
  echo "      src/core/src/env_table.cpp and docs/user/environment.md) and other programs' variables"
  echo "      with ds::env::external():"
  echo "$hits"
  exit 1
fi
echo "ok: no getenv( outside src/core/src/env.cpp"
