#!/usr/bin/env bash
# Installs the Debian packages dstrain needs. Run as root on Debian 12 (bookworm).
#   install_deps.sh          everything: build, run, test, fuzz, benchmark (scripts/test.sh)
#   install_deps.sh --run    what building and running the train app needs (scripts/run_default.sh)
# Idempotent and quiet: a second run is a fast no-op. Nothing else is assumed on the machine:
# a minimal Debian 12 (debootstrap --variant=minbase) gets every tool the scripts, CMake and the
# tests call from here (scripts/check_fresh_debian.sh proves it for --run).
set -euo pipefail

# Build and run: compilers, CMake + Ninja (every script configures with -G Ninja), MPI, HDF5,
# the header-only CLI and JSON libraries, OpenBLAS (OpenMP flavour).
RUN_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  openmpi-bin libopenmpi-dev
  libhdf5-dev
  libcli11-dev nlohmann-json3-dev
  libopenblas-dev libopenblas0-openmp
)
# Tests, fuzzers and benchmarks on top: GoogleTest/benchmark, clang + libFuzzer runtime,
# h5dump, the system Python with mpi4py/h5py/numpy/torch (interop tests and baselines), libtorch
# (the optional PyTorch adapter, DS_WITH_TORCH: built and tested where it is installed),
# Slurm + munge (single-node Slurm tests), iproute2 (network namespaces), ssh (the launcher's
# reachability check), procps, git, debootstrap (the fresh-machine check), scikit-learn (its
# bundled digits images: real feature data for the HDF5 data tests); on x86-64 also
# the arm64 cross compiler and qemu-user (the arm64 check, scripts/check_arm64.sh).
TEST_PACKAGES=(
  git ca-certificates
  hdf5-tools
  libgtest-dev libgmock-dev libbenchmark-dev
  clang libclang-rt-14-dev
  python3 python3-mpi4py python3-h5py python3-numpy python3-torch libtorch-dev python3-sklearn
  # Slurm: sbatch/srun/sinfo (slurm-client), the controller and node daemons the tests start
  # (slurmctld, slurmd), munge for their authentication; slurm-wlm is Debian's bundle of them.
  slurm-client
  slurmctld
  slurmd
  munge
  slurm-wlm
  iproute2 procps openssh-client
  debootstrap
)
if [ "$(dpkg --print-architecture 2>/dev/null)" = amd64 ]; then
  TEST_PACKAGES+=(g++-aarch64-linux-gnu qemu-user)
fi

case "${1:-}" in
  "")    PACKAGES=("${RUN_PACKAGES[@]}" "${TEST_PACKAGES[@]}") ;;
  --run) PACKAGES=("${RUN_PACKAGES[@]}") ;;
  *)     echo "install_deps.sh: error: unknown argument '$1' (usage: install_deps.sh [--run])" >&2; exit 2 ;;
esac

if [ "$(id -u)" != 0 ]; then
  echo "install_deps.sh: must run as root (it calls apt-get)" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null; then
  echo "install_deps.sh: apt-get not found; dstrain's scripts target Debian 12" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

export DEBIAN_FRONTEND=noninteractive
# Package scripts must not start munge/slurm daemons (the tests start their own), so a
# policy-rc.d that denies service starts is in place during the install only. One that was
# already there (a container's) is left alone; ours is removed on every exit path, so later
# installs on the machine start their services as usual.
POLICY=/usr/sbin/policy-rc.d
if [ ! -e "$POLICY" ] && [ ! -L "$POLICY" ]; then
  trap 'rm -f "$POLICY"' EXIT
  trap 'exit 130' INT TERM
  printf '#!/bin/sh\n# Written by dstrain install_deps.sh for the duration of its install.\nexit 101\n' >"$POLICY"
  chmod +x "$POLICY"
fi
echo "install_deps.sh: installing ${#missing[@]} package(s): ${missing[*]}"
log=$(mktemp)
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  echo "install_deps.sh: apt-get failed installing: ${missing[*]}" >&2
  tail -n 30 "$log" >&2
  rm -f "$log"
  exit 1
fi
rm -f "$log"
