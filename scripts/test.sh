#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this):
#   1. install the Debian packages (idempotent),
#   2. Release build (CUDA code compiled when nvcc is present) and every ctest test:
#      unit (GoogleTest), multi-rank (real mpirun, 2 and 4 ranks), end-to-end (apps, Slurm),
#   3. the fresh-machine check: the README's first command in a minimal Debian 12 root, with
#      and without the host's CUDA toolkit (scripts/check_fresh_debian.sh, ctest label "fresh"),
#      and the arm64 check: the cross build for aarch64, its unit tests under qemu-aarch64 and
#      its train losses against step 2's build (scripts/check_arm64.sh); both started with
#      step 2's tests and running beside them,
#   4. the unit tests again under AddressSanitizer + UBSan (built at the lowest CPU priority
#      beside steps 2-3, run after them),
#   5. the libFuzzer targets (built like step 4's binaries) for a bounded time on seed
#      corpora from configs/ and tests/.
# Usage: scripts/test.sh            (everything)
#        DS_TEST_QUICK=1 scripts/test.sh   (steps 1-2 only)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${DS_JOBS:-$(nproc)}
T0=$(date +%s)
stamp() { echo "[test.sh +$(( $(date +%s) - T0 ))s] $*"; }

if [ "$(id -u)" = 0 ]; then bash scripts/install_deps.sh; else sudo bash scripts/install_deps.sh; fi
stamp "packages ok"

source scripts/mpi_env.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DDS_BUILD_TESTS=ON -DDS_BUILD_BENCH=ON >build-configure.log 2>&1 || { cat build-configure.log; exit 1; }
cmake --build build -j"$JOBS"
stamp "build ok"
# The fresh-machine check (the test labelled "fresh": scripts/check_fresh_debian.sh) runs beside
# the Release tests, not after them: it spends much of its time in apt and dpkg (one core,
# waiting on the disk) and the Release tests keep only about 1.2 of the 2 cores busy (a
# multi-rank test takes every ctest slot, and many wait on timers, daemons or signals; sums in
# bench/results/test-suite-time.md). Its output goes to build/ctest-fresh.log, shown after.
# The arm64 check (scripts/check_arm64.sh) runs beside them the same way, its build on one
# core (its output: build/check-arm64.log).
#
# The builds of steps 4 and 5 (ASan+UBSan, the fuzz targets) start beside them too, at the
# lowest CPU priority (nice 19): they only take the CPU time the tests and the checks leave
# idle (tests waiting on timers, daemons or signals, apt and dpkg waiting on the disk,
# single-threaded configure and link steps, the end of the stage once the first of them is
# done), so they slow neither, and what is left of them runs after at full speed (logs:
# build/asan-build.log, build/fuzz-build.log).
# ASan at -O0 with line tables only (-g1): the reports' stack traces need file and line, not
# variables. -O0 compiles these sources 2.3-2.9x faster than -O1 and the unit tests run about as
# fast, so the stage is mostly the build (bench/results/test-suite-time.md); nothing is
# optimised away from the checks. CPU code only, benchmarks off.
asan_build() {
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDS_SANITIZE=ON \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O0 -g1" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O0 -g1" \
        -DDS_WITH_CUDA=OFF -DDS_BUILD_BENCH=OFF >build-asan-configure.log 2>&1 || { cat build-asan-configure.log; return 1; }
  cmake --build build-asan -j"$JOBS" --target ds_unit_tests || return 1
  stamp "ASan+UBSan build done"
}
# Both fuzz targets in one clang build directory, one after the other. A failure here only
# costs time: step 5 runs the same build steps again and reports it.
fuzz_build() {
  export DS_FUZZ_BUILD_DIR=$ROOT/build-fuzz DS_FUZZ_STEP=build
  bash scripts/fuzz_config.sh && bash scripts/fuzz_launcher.sh || return 1
  stamp "fuzz build done"
}
# start_low VAR LOG FUNCTION: runs FUNCTION (above) in the background in a session of its own
# (stopped as a whole by the EXIT trap), at nice 19; VAR gets its pid. Where the kernel groups
# tasks by session (CONFIG_SCHED_AUTOGROUP, as Debian's), the CPU is shared between the
# sessions first and a task's nice only counts inside its own, so the session's group gets
# nice 19 too (measured: a nice 19 session without it took as much CPU as a nice 0 one; with
# it, a tenth).
start_low() {
  setsid nice -n 19 bash -c "echo 19 2>/dev/null >/proc/\$\$/autogroup; $(declare -f stamp "$3")
                             ROOT=$ROOT T0=$T0 JOBS=$JOBS; $3" >"$2" 2>&1 </dev/null &
  printf -v "$1" '%s' "$!"
}
fresh_pid= arm64_pid= asan_pid= fuzzbuild_pid=
if [ "${DS_TEST_QUICK:-0}" != 1 ]; then
  bash scripts/check_fresh_debian.sh >build/ctest-fresh.log 2>&1 </dev/null &
  fresh_pid=$!
  # In a session of its own, so that stopping it stops its build and qemu processes too.
  DS_JOBS=1 setsid bash scripts/check_arm64.sh >build/check-arm64.log 2>&1 </dev/null &
  arm64_pid=$!
  start_low asan_pid build/asan-build.log asan_build
  start_low fuzzbuild_pid build/fuzz-build.log fuzz_build
  # A failing stage ends the script: the checks and the builds are stopped too (the fresh
  # check's trap removes its root).
  trap '[ -z "$fresh_pid" ] || kill -TERM "$fresh_pid" 2>/dev/null || true
        for pid in "$arm64_pid" "$asan_pid" "$fuzzbuild_pid"; do
          [ -z "$pid" ] || kill -TERM -- "-$pid" 2>/dev/null || true
        done; wait 2>/dev/null; true' EXIT
  stamp "fresh-machine check, arm64 check and (nice 19) the ASan and fuzz builds started"
  echo "  logs: build/ctest-fresh.log, build/check-arm64.log, build/asan-build.log, build/fuzz-build.log"
fi
ctest --test-dir build -j"$JOBS" -LE fresh --output-on-failure --timeout 600 2>&1 | tee build/ctest-release.log
stamp "ctest (Release) ok"

[ "${DS_TEST_QUICK:-0}" = 1 ] && exit 0

# Waits for a check started beside the Release tests, prints its log and its result, and puts
# its exit status in the variable named $4 (77: skipped); a failed check ends the suite.
finish_check() {
  local pid=$1 log=$2 what=$3 rc=0
  wait "$pid" || rc=$?
  cat "$log"
  case "$rc" in
    0) stamp "$what ok" ;;
    77) stamp "$what skipped" ;;
    *) echo "test.sh: the $what failed (exit $rc; its log is above)" >&2; exit 1 ;;
  esac
  printf -v "$4" '%s' "$rc"
}
finish_check "$fresh_pid" build/ctest-fresh.log "fresh-machine check (Debian 12)" fresh_rc
fresh_pid=
finish_check "$arm64_pid" build/check-arm64.log "arm64 check (cross build, unit tests under qemu, losses)" arm64_rc
arm64_pid=

# Unit tests under AddressSanitizer + UBSan, once their build (started beside step 2) is done.
asan_rc=0
wait "$asan_pid" || asan_rc=$?
asan_pid=
[ "$asan_rc" = 0 ] || { cat build/asan-build.log; echo "test.sh: the ASan+UBSan build failed (exit $asan_rc; its log is above)" >&2; exit 1; }
tail -n 2 build/asan-build.log
ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 LSAN_OPTIONS=suppressions=$ROOT/tests/lsan.supp UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -j"$JOBS" -L unit --output-on-failure --timeout 600
stamp "ctest (ASan+UBSan, unit) ok"

# Fuzzers, bounded. They share one clang build directory, so they are built one after the
# other (mostly done beside step 2 already: fuzz_build), then run at once: a fuzzer is one
# process, so each still has a core to itself for its DS_FUZZ_SECONDS. Their output goes to
# build-fuzz/<script>.out, shown when both are done.
wait "$fuzzbuild_pid" || true
fuzzbuild_pid=
export DS_FUZZ_BUILD_DIR=$ROOT/build-fuzz
fuzzers=(scripts/fuzz_config.sh scripts/fuzz_launcher.sh)
for f in "${fuzzers[@]}"; do DS_FUZZ_STEP=build bash "$f"; done
fuzz_pids=()
for f in "${fuzzers[@]}"; do
  DS_FUZZ_STEP=run bash "$f" "${DS_FUZZ_SECONDS:-20}" >"build-fuzz/$(basename "$f" .sh).out" 2>&1 </dev/null &
  fuzz_pids+=($!)
done
fuzz_rc=0
for i in "${!fuzzers[@]}"; do
  rc=0
  wait "${fuzz_pids[$i]}" || rc=$?
  cat "build-fuzz/$(basename "${fuzzers[$i]}" .sh).out"
  [ "$rc" = 0 ] || { echo "test.sh: ${fuzzers[$i]} failed (exit $rc; its output is above)" >&2; fuzz_rc=1; }
done
[ "$fuzz_rc" = 0 ] || exit 1
stamp "fuzzing ok"
# The per-test Open MPI session bases (tests/CMakeLists.txt) that Open MPI left empty.
find /tmp -maxdepth 1 -name 'dstest-*' -type d -empty -delete 2>/dev/null || true

# One closing line for the whole suite, from the Release stage's ctest summary and the exit
# statuses of the fresh-machine and arm64 checks, one test each (ctest counts a skipped test
# among the passed ones; it is reported apart here).
summary=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' build/ctest-release.log | tail -n 1)
total=$(( $(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$summary") + 2 ))
failed=$(sed -E 's/.*passed, ([0-9]+) tests? failed.*/\1/' <<<"$summary")
skipped=$(grep -cE '^[[:space:]]*[0-9]+ - .* \(Skipped\)$' build/ctest-release.log || true)
[ "$fresh_rc" = 77 ] && skipped=$((skipped + 1))
[ "$arm64_rc" = 77 ] && skipped=$((skipped + 1))
stamp "all done"
echo "suite: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
