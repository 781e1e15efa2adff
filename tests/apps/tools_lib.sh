# Shared setup of the auxiliary tools' command-line tests (sourced as `source tools_lib.sh NAME`):
# B is the apps build directory, T a scratch directory /tmp/ds_tools_NAME.XXXXXX removed on
# exit, and fail counts a failure and goes on (each script exits 1 at its end when $fails > 0),
# so one run reports every broken case. ctest sets DS_BINARY_DIR.
set -uo pipefail
B=$DS_BINARY_DIR/apps
T=$(mktemp -d "/tmp/ds_tools_$1.XXXXXX")
trap 'rm -rf "$T"' EXIT
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
