#!/usr/bin/env bash
# Installs every Debian package dstrain needs to build, test and benchmark.
# Idempotent and quiet: a second run is a fast no-op. Run as root on Debian 12.
set -euo pipefail

PACKAGES=(
  build-essential cmake git pkg-config ca-certificates
  openmpi-bin libopenmpi-dev
  libhdf5-dev hdf5-tools
  libcli11-dev nlohmann-json3-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libopenblas-dev libopenblas0-openmp
  clang libclang-rt-14-dev
  python3 python3-mpi4py python3-h5py python3-numpy python3-torch
  slurm-wlm munge
  iproute2 procps
)

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
# Package scripts must not start munge/slurm daemons: tests start their own.
if [ ! -e /usr/sbin/policy-rc.d ]; then
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
fi
echo "install_deps.sh: installing ${#missing[@]} package(s): ${missing[*]}"
log=$(mktemp)
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
  echo "install_deps.sh: apt-get failed installing: ${missing[*]}" >&2
  tail -n 30 "$log" >&2
  exit 1
fi
rm -f "$log"
