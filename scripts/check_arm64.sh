#!/usr/bin/env bash
# The arm64 check: dstrain cross-built for aarch64 (Debian's g++-aarch64-linux-gnu against an
# arm64 sysroot of Debian packages), its unit and kernel tests run under qemu-aarch64, and the
# train app's losses on configs/default.json compared with the x86-64 build's.
#
#   check_arm64.sh [--steps N]      (default 4 training steps)
#
# 1. installs what it needs (scripts/install_deps.sh: the cross compiler and qemu-user are in
#    its full set) and adds arm64 to dpkg's architectures (package lists only; nothing arm64 is
#    installed on the host);
# 2. makes the sysroot /var/cache/dstrain/arm64/sysroot: the :arm64 packages the build links
#    (libc, libstdc++, Open MPI, HDF5, OpenBLAS, GoogleTest) and their run-time dependencies,
#    resolved by apt as on an empty machine, downloaded with apt-get download and unpacked with
#    dpkg -x (remade only when that package set changes; the .deb files are kept in debs/);
# 3. configures build-arm64 (cmake/toolchain-aarch64-linux-gnu.cmake, no CUDA, no benchmarks),
#    builds the unit test binaries and train, and runs ctest -L unit there: every binary runs
#    through qemu-aarch64 -L sysroot (the toolchain's CMAKE_CROSSCOMPILING_EMULATOR);
# 4. runs train on one rank (an Open MPI singleton, no mpirun) under qemu and the host's
#    build/apps/train/train (the x86-64 Release build, which must be there) with the same
#    arguments, and fails unless every logged loss agrees within 1e-5 relative.
# Exits 77 (ctest: skipped) where it cannot run: not root, no apt-get, or not an x86-64 host.
# Output: build-arm64/ (DS_ARM64_BUILD), logs and loss files included.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${DS_ARM64_BUILD:-$SRC/build-arm64}
# Outside the source tree: CMake refuses exported include directories inside it.
CACHE=${DS_ARM64_CACHE:-/var/cache/dstrain/arm64}
SYSROOT=$CACHE/sysroot
JOBS=${DS_JOBS:-$(nproc)}
T0=$(date +%s)
say() { echo "check_arm64 [+$(( $(date +%s) - T0 ))s]: $*"; }
die() { echo "check_arm64: error: $*" >&2; exit 1; }
skip() { echo "check_arm64: SKIPPED: $*"; exit 77; }

steps=4
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) steps=${2:?--steps needs a number}; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "check_arm64: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

[ "$(id -u)" = 0 ] || skip "needs root (apt-get, dpkg --add-architecture)"
command -v apt-get >/dev/null || skip "no apt-get: the check needs Debian's arm64 packages"
host_arch=$(dpkg --print-architecture)
[ "$host_arch" = amd64 ] || skip "the host is $host_arch: the check cross-builds from x86-64 (on arm64 the usual build and tests are the check)"

# ---- 1. host packages and arm64 package lists --------------------------------------------------
bash "$SRC/scripts/install_deps.sh"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
fi
if ! apt-cache show libc6:arm64 >/dev/null 2>&1; then
  apt-get update -qq || die "apt-get update failed (arm64 package lists)"
fi
say "packages ok"

# ---- 2. the sysroot -------------------------------------------------------------------------------
# What the build links (arm64) and the architecture-independent headers it includes.
ARM64_ROOTS=(libc6-dev libstdc++-12-dev libgomp1 libopenmpi-dev libhdf5-dev libopenblas-dev libopenblas0-openmp
             libgtest-dev)
ALL_ROOTS=(nlohmann-json3-dev libcli11-dev openmpi-common)
# Pulled in by the compiler wrappers' dependencies (mpicc, mpifort), never used: the cross
# compiler is the host's.
TOOLCHAIN_ONLY='^(gcc-12|cpp-12|gfortran-12|binutils|binutils-common|binutils-aarch64-linux-gnu|libbinutils|libctf0|libctf-nobfd0|libgprofng0|libjansson4|libgfortran-12-dev|libcc1-0|libisl23|libmpc3|libmpfr6|libasan8|libtsan2|libhwasan0|liblsan0|libubsan1|libitm1):arm64$'

# "name=version" of every package of the sysroot: apt's own resolution for an empty machine,
# the arm64 ones and the named architecture-independent ones.
resolve_packages() {
  local status
  status=$(mktemp)
  apt-get -s -o Dir::State::status="$status" -o APT::Install-Recommends=0 \
    install "${ARM64_ROOTS[@]/%/:arm64}" "${ALL_ROOTS[@]}" 2>&1 |
    awk '$1 == "Inst" { v = $3; gsub(/[()]/, "", v); print $2 "=" v }' |
    grep -E "^[^=]+:arm64=|^($(IFS='|'; echo "${ALL_ROOTS[*]}"))=" | grep -vE "${TOOLCHAIN_ONLY/\$/=}" | sort
  rm -f "$status"
}

# Absolute symbolic links point into the host's tree: re-point them inside the sysroot.
reroot_links() {
  local link target
  while IFS= read -r -d '' link; do
    target=$(readlink "$link")
    ln -sfn "$SYSROOT$target" "$link"
  done < <(find "$SYSROOT" -type l -lname '/*' -print0)
}

# The links update-alternatives makes when the packages are installed (dpkg -x runs no
# maintainer scripts), those the build looks up: Open MPI as "mpi", HDF5's serial flavour.
add_alternatives() {
  local lib=$SYSROOT/usr/lib/aarch64-linux-gnu
  ln -sfn ompi-c.pc "$lib/pkgconfig/mpi-c.pc"
  ln -sfn ompi-cxx.pc "$lib/pkgconfig/mpi-cxx.pc"
  ln -sfn ompi.pc "$lib/pkgconfig/mpi.pc"
  ln -sfn openmpi/lib/libmpi.so "$lib/libmpi.so"
  ln -sfn openmpi/lib/libmpi_cxx.so "$lib/libmpi++.so"
  ln -sfn hdf5-serial.pc "$lib/pkgconfig/hdf5.pc"
  ln -sfn ../../lib/aarch64-linux-gnu/openmpi/include "$SYSROOT/usr/include/aarch64-linux-gnu/mpi"
}

make_sysroot() {
  local want
  want=$(resolve_packages)
  [ -n "$want" ] || die "apt resolved no arm64 packages (are the arm64 package lists there? apt-get update)"
  if [ -f "$SYSROOT/.packages" ] && [ "$(cat "$SYSROOT/.packages")" = "$want" ]; then
    say "sysroot up to date ($(wc -l <<<"$want") packages)"
    return
  fi
  mkdir -p "$CACHE/debs"
  # apt-get download writes to the current directory; as root it warns that the _apt user
  # cannot write there (the download then runs unsandboxed), which is expected here.
  (cd "$CACHE/debs" && apt-get download -qq $want 2>&1 | grep -v "unsandboxed" || true)
  rm -rf "$SYSROOT"
  mkdir -p "$SYSROOT"
  local spec deb
  for spec in $want; do
    deb=$(ls "$CACHE/debs/${spec%%[:=]*}_${spec#*=}_"*.deb 2>/dev/null | head -n 1 || true)
    [ -z "$deb" ] && deb=$(ls "$CACHE/debs/${spec%%[:=]*}_$(sed 's/:/%3a/' <<<"${spec#*=}")_"*.deb 2>/dev/null | head -n 1 || true)
    [ -n "$deb" ] || die "apt-get download did not fetch $spec"
    dpkg -x "$deb" "$SYSROOT"
  done
  reroot_links
  add_alternatives
  echo "$want" >"$SYSROOT/.packages"
  say "sysroot made: $(wc -l <<<"$want") packages in $SYSROOT"
}
make_sysroot

# ---- 3. cross build, unit and kernel tests under qemu ---------------------------------------------
# What runs under qemu-user: one process, no mpirun. An Open MPI singleton starts an orted
# daemon: from the emulated process, exec runs the host's x86-64 /usr/bin/orted, which works
# while host and sysroot have the same Open MPI; an isolated singleton starts none and does not
# depend on that (it could not spawn ranks, which nothing here does).
export OMPI_MCA_ess_singleton_isolated=1
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
cmake -S "$SRC" -B "$OUT" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$SRC/cmake/toolchain-aarch64-linux-gnu.cmake" \
      -DDS_ARM64_SYSROOT="$SYSROOT" -DCMAKE_BUILD_TYPE=Release -DDS_WITH_CUDA=OFF -DDS_BUILD_BENCH=OFF \
      -DDS_BUILD_TESTS=ON >"$OUT/configure.log" 2>&1 || { cat "$OUT/configure.log"; die "configure failed"; }
t=$(date +%s)
cmake --build "$OUT" -j"$JOBS" --target ds_unit_tests train
say "cross build ok ($(( $(date +%s) - t )) s)"
t=$(date +%s)
ctest --test-dir "$OUT" -L unit -j"$JOBS" --output-on-failure --timeout 600 2>&1 | tee "$OUT/ctest-unit.log" |
  grep -vE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' || true
grep -qE '^100% tests passed' "$OUT/ctest-unit.log" || die "unit tests under qemu failed (log: $OUT/ctest-unit.log)"
say "unit tests under qemu ok ($(( $(date +%s) - t )) s): $(grep -E 'tests passed' "$OUT/ctest-unit.log")"

# ---- 4. train on both builds, losses compared -----------------------------------------------------
X86_TRAIN=$SRC/build/apps/train/train
[ -x "$X86_TRAIN" ] || die "no x86-64 build to compare with ($X86_TRAIN): build it first (scripts/test.sh does)"
TRAIN_ARGS=(--config "$SRC/configs/default.json" --steps "$steps" --eval_iters 0 --sample_tokens 0 --device cpu
            --progress lines)
"$X86_TRAIN" "${TRAIN_ARGS[@]}" --loss_csv "$OUT/losses-x86_64.csv" >"$OUT/train-x86_64.log" 2>&1 ||
  { cat "$OUT/train-x86_64.log"; die "the x86-64 train run failed"; }
t=$(date +%s)
qemu-aarch64 -L "$SYSROOT" "$OUT/apps/train/train" "${TRAIN_ARGS[@]}" --loss_csv "$OUT/losses-aarch64.csv" \
  >"$OUT/train-aarch64.log" 2>&1 || { cat "$OUT/train-aarch64.log"; die "the aarch64 train run under qemu failed"; }
say "train under qemu ok ($(( $(date +%s) - t )) s)"
# step,loss,... from each run: the same steps, every loss within 1e-5 relative.
awk -F, 'NR == FNR { if (FNR > 1) x86[$1] = $2; next }
         FNR > 1 { n++; if (!($1 in x86)) { print "step " $1 ": no x86-64 loss"; bad++; next }
                   d = $2 - x86[$1]; if (d < 0) d = -d; r = d / (x86[$1] < 0 ? -x86[$1] : x86[$1])
                   printf "step %s: loss x86-64 %s aarch64 %s (relative difference %.2e)\n", $1, x86[$1], $2, r
                   if (r > 1e-5) bad++ }
         END { if (n != length(x86)) { print "steps: " length(x86) " on x86-64, " n " on aarch64"; bad++ }
               exit bad > 0 }' "$OUT/losses-x86_64.csv" "$OUT/losses-aarch64.csv" ||
  die "the aarch64 losses differ from the x86-64 ones by more than 1e-5 relative"
say "all done: aarch64 build, unit tests and losses agree with x86-64"
