#!/bin/bash
# Bad command lines of the auxiliary tools (ds_to_fp32, ds_config, ds_report, dsrun): exit 2
# and one line "<tool>: error: <what> (see <tool> --help)" on stderr, never CLI11's own exit
# codes (105-109) and two-line message; --help still prints usage and exits 0.
# usage: tools_usage_test.sh
source "$(dirname "$0")/tools_lib.sh" usage

# usage_error TOOL NEEDLE ARGS...
usage_error() {
  local tool=$1 needle=$2
  shift 2
  local rc=0
  "$B/$tool/$tool" "$@" >"$T/out" 2>"$T/err" </dev/null || rc=$?
  [ "$rc" = 2 ] || fail "$tool $*: exit $rc, want 2 (stderr: $(head -c 300 "$T/err"))"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "$tool $*: stderr is not one line: $(cat "$T/err")"
  grep -qxF -- "$tool: error: $needle (see $tool --help)" "$T/err" ||
    fail "$tool $*: want '$tool: error: $needle (see $tool --help)', got: $(cat "$T/err")"
}
help_ok() {
  local tool=$1 rc=0
  "$B/$tool/$tool" --help >"$T/out" 2>"$T/err" </dev/null || rc=$?
  [ "$rc" = 0 ] || fail "$tool --help: exit $rc"
  grep -q "Usage:" "$T/out" || fail "$tool --help: no usage on stdout"
}

usage_error ds_to_fp32 "CHECKPOINT_DIR is required"
usage_error ds_to_fp32 "--format: x not in {hdf5,safetensors}" ckpt out.h5 --format x
usage_error ds_to_fp32 "The following argument was not expected: extra" ckpt out.h5 extra
help_ok ds_to_fp32

usage_error ds_config "A subcommand is required"
usage_error ds_config "FILE is required" check
usage_error ds_config "--world_size: Value 0 not in range 1 to 2147483647" check f.json --world_size 0
usage_error ds_config "--steps is required" schedule f.json
help_ok ds_config

usage_error ds_report "The following argument was not expected: --bogus" --bogus
help_ok ds_report

usage_error dsrun "Could not convert: --num_nodes = abc" --num_nodes abc prog
help_ok dsrun

[ "$fails" = 0 ] || { echo "tools_usage_test: $fails failure(s)"; exit 1; }
echo "tools_usage_test: OK"
