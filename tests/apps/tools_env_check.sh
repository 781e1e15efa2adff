#!/bin/bash
# Every tool checks the registered DS_* variables first: a bad value is one line
# "<tool>: error: environment variable NAME='value': <what is accepted>" and a non-zero exit,
# before any other work (the files named on the command line do not exist); ds_report --env
# lists every registered variable with its current value.
# usage: tools_env_check.sh
source "$(dirname "$0")/tools_lib.sh" env

# bad_env TOOL 'NAME=VALUE' NEEDLE ARGS...
bad_env() {
  local tool=$1 assign=$2 needle=$3
  shift 3
  local rc=0
  env "$assign" "$B/$tool/$tool" "$@" >"$T/out" 2>"$T/err" </dev/null || rc=$?
  [ "$rc" != 0 ] || fail "$assign $tool $*: exit 0"
  [ "$(wc -l <"$T/err")" = 1 ] || fail "$assign $tool $*: stderr is not one line: $(cat "$T/err")"
  grep -qF -- "$tool: error: environment variable ${assign%%=*}='${assign#*=}': $needle" "$T/err" ||
    fail "$assign $tool $*: want '$tool: error: environment variable ${assign%%=*}=... $needle', got: $(cat "$T/err")"
}

bad_env ds_report DS_LOG_LEVEL=loud "expected one of debug|info|warn|error" --no_mpi
bad_env ds_config DS_LOG_ALL_RANKS=2 "expected 0 or 1" check "$T/none.json"
bad_env ds_to_fp32 DS_CPU_ISA=sse2 "expected one of auto|avx512|avx2|neon|plain" "$T/no_ckpt" "$T/out.h5"
case "$(uname -m)" in
  x86_64) bad_env ds_config DS_CPU_ISA=neon "this CPU lacks aarch64 Advanced SIMD" check "$T/none.json" ;;
  *) bad_env ds_config DS_CPU_ISA=avx2 "this CPU lacks AVX2" check "$T/none.json" ;;
esac
bad_env dsrun DS_NN_GEMM=blas "expected one of auto|openblas|own" --dry_run true

# A good value is accepted (the report runs).
DS_LOG_LEVEL=warn "$B/ds_report/ds_report" --no_mpi >"$T/out" 2>"$T/err" || fail "DS_LOG_LEVEL=warn ds_report: $(cat "$T/err")"

# ds_report --env: every registered variable with class, type, default and current value.
env -u DS_CPU_ISA DS_NN_ROWS=plain "$B/ds_report/ds_report" --env >"$T/out" 2>"$T/err" || fail "ds_report --env: $(cat "$T/err")"
grep -qxF 'DS_NN_ROWS  [debug, choice: one of auto|plain]  default auto  value plain' "$T/out" ||
  fail "ds_report --env: no DS_NN_ROWS line with its value: $(cat "$T/out")"
grep -qxF 'DS_CPU_ISA  [debug, choice: one of auto|avx512|avx2|neon|plain]  default auto  value unset' "$T/out" ||
  fail "ds_report --env: no DS_CPU_ISA line (unset): $(cat "$T/out")"
env -u DS_CPU_ISA DS_NN_ROWS=plain "$B/ds_report/ds_report" --env --json >"$T/json" 2>"$T/err" || fail "ds_report --env --json: $(cat "$T/err")"
"${DS_SYSTEM_PYTHON:-python3}" - "$T/json" <<'PYEOF' || fail "ds_report --env --json: $(cat "$T/json")"
import json, sys
v = {e["name"]: e for e in json.load(open(sys.argv[1]))["environment"]}
assert v["DS_NN_ROWS"]["value"] == "plain" and v["DS_NN_ROWS"]["default"] == "auto", v["DS_NN_ROWS"]
assert v["DS_CPU_ISA"]["value"] is None and v["DS_CPU_ISA"]["class"] == "debug", v["DS_CPU_ISA"]
assert v["DS_LOG_LEVEL"]["type"] == "choice" and v["DS_LOG_LEVEL"]["help"], v["DS_LOG_LEVEL"]
PYEOF

[ "$fails" = 0 ] || exit 1
echo "ok: every tool rejects a bad DS_* value in one line"
