#!/usr/bin/env bash
# Fuzz the ds_config.json parser with libFuzzer (+ ASan/UBSan) for a bounded time.
#
#   scripts/fuzz_config.sh [SECONDS]      default 30; exits non-zero on a crash or violation
#
# DS_FUZZ_STEP=build only configures and builds; DS_FUZZ_STEP=run only fuzzes what a build
# step left (scripts/test.sh builds both fuzz targets first, then runs both fuzzers at once).
# Configures a separate clang build dir (DS_FUZZ_BUILD_DIR, default build-fuzz) with
# -DDS_FUZZ=ON, builds only tests/fuzz's config_fuzz target, and runs it over the seed corpus
# (configs/*.json, tests/config/data, tests/fuzz/corpus). New interesting inputs go to
# <build>/fuzz-corpus/config; a crashing input is saved under <build>/fuzz-artifacts/.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECS=${1:-30}
BUILD=${DS_FUZZ_BUILD_DIR:-$ROOT/build-fuzz}
JOBS=${DS_FUZZ_BUILD_JOBS:-2}

STEP=${DS_FUZZ_STEP:-all}
case "$STEP" in all|build|run) ;; *) echo "fuzz_config.sh: DS_FUZZ_STEP must be all, build or run" >&2; exit 2 ;; esac
command -v clang++ >/dev/null || { echo "fuzz_config.sh: clang++ not found (run scripts/install_deps.sh)" >&2; exit 2; }

if [ "$STEP" != run ]; then
  mkdir -p "$BUILD"
  if ! cmake -G Ninja -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DDS_FUZZ=ON -DDS_BUILD_TESTS=ON -DDS_BUILD_BENCH=OFF -DDS_WITH_CUDA=OFF -DDS_WITH_NCCL=OFF \
      >"$BUILD/fuzz-configure.log" 2>&1; then
    echo "fuzz_config.sh: configure failed; see $BUILD/fuzz-configure.log" >&2
    tail -20 "$BUILD/fuzz-configure.log" >&2
    exit 2
  fi
  cmake --build "$BUILD" --target config_fuzz -j "$JOBS" >"$BUILD/fuzz-build.log" 2>&1 || {
    echo "fuzz_config.sh: build failed; see $BUILD/fuzz-build.log" >&2
    tail -20 "$BUILD/fuzz-build.log" >&2
    exit 2
  }
fi
[ "$STEP" = build ] && exit 0
[ -x "$BUILD/tests/fuzz/config_fuzz" ] || { echo "fuzz_config.sh: no $BUILD/tests/fuzz/config_fuzz (DS_FUZZ_STEP=build first)" >&2; exit 2; }

CORPUS=$BUILD/fuzz-corpus/config
ARTIFACTS=$BUILD/fuzz-artifacts
mkdir -p "$CORPUS" "$ARTIFACTS"
SEEDS=()
for d in "$ROOT/configs" "$ROOT/tests/config/data" "$ROOT/tests/fuzz/corpus"; do
  [ -d "$d" ] && SEEDS+=("$d")
done

echo "fuzz_config.sh: fuzzing the config parser for ${SECS}s (corpus $CORPUS, seeds: ${SEEDS[*]})"
set +e
"$BUILD/tests/fuzz/config_fuzz" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
  -dict="$ROOT/tests/fuzz/config.dict" -artifact_prefix="$ARTIFACTS/" -print_final_stats=1 \
  "$CORPUS" "${SEEDS[@]}" 2>&1 | tee "$BUILD/fuzz-run.log" | grep -vE '^#[0-9]+\s+(NEW|REDUCE)' | tail -40
rc=${PIPESTATUS[0]}
set -e
if [ "$rc" -ne 0 ]; then
  echo "fuzz_config.sh: the fuzzer found a problem (exit $rc); inputs in $ARTIFACTS, log $BUILD/fuzz-run.log" >&2
  exit 1
fi
echo "fuzz_config.sh: no crash in ${SECS}s"
