#!/usr/bin/env bash
# Fuzz the launcher's parsers (hostfile, .deepspeed_env, include/exclude, Slurm host lists,
# task counts, --launcher_args) with libFuzzer for a bounded time.
# Usage: scripts/fuzz_launcher.sh [SECONDS=30]
# Configures build-fuzz-launch with clang and -DDS_FUZZ=ON, builds fuzz_launch_parsers,
# and runs it on the seed corpus tests/launcher/fuzz_corpus (example hostfiles etc.).
# New interesting inputs land in build-fuzz-launch/fuzz_work; crashes in build-fuzz-launch/crashes.
# DS_FUZZ_STEP=build only configures and builds; DS_FUZZ_STEP=run only fuzzes what a build
# step left (scripts/test.sh builds both fuzz targets first, then runs both fuzzers at once).
set -euo pipefail
secs=${1:-30}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${DS_FUZZ_BUILD_DIR:-$root/build-fuzz-launch}
step=${DS_FUZZ_STEP:-all}
case "$step" in all|build|run) ;; *) echo "fuzz_launcher.sh: DS_FUZZ_STEP must be all, build or run" >&2; exit 2 ;; esac
if [ "$step" != run ]; then
  if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=clang CXX=clang++ cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DDS_FUZZ=ON -DDS_BUILD_BENCH=OFF > "$build.configure.log" 2>&1 \
      || { tail -n 30 "$build.configure.log"; exit 1; }
  fi
  cmake --build "$build" --target fuzz_launch_parsers -j2
fi
[ "$step" = build ] && exit 0
mkdir -p "$build/fuzz_work" "$build/crashes"
exe=$(find "$build" -name fuzz_launch_parsers -type f -perm -u+x | head -n 1)
[ -n "$exe" ] || { echo "fuzz_launcher.sh: no fuzz_launch_parsers under $build (DS_FUZZ_STEP=build first)" >&2; exit 2; }
"$exe" -max_total_time="$secs" -print_final_stats=1 -artifact_prefix="$build/crashes/" \
  -max_len=4096 -timeout=10 "$build/fuzz_work" "$root/tests/launcher/fuzz_corpus"
