#!/usr/bin/env bash
# The fresh-machine check: the README's first command (scripts/run_default.sh: install, build,
# run the main job) inside a minimal Debian 12 (debootstrap --variant=minbase bookworm) that has
# nothing but the committed project, as a new user's machine would.
#
#   check_fresh_debian.sh [--cuda auto|on|off] [--commit REV]
#
# Runs it once with the host's /usr/local/cuda bind-mounted (when the host has it; --cuda on
# requires it) and once without (a CPU-only node). Fails when either run exits non-zero, when
# the job prints no final validation loss, or when the install leaves a policy-rc.d behind.
# Exits 77 (ctest: skipped) only where debootstrap cannot run at all: not root, or no Debian
# mirror in the host's apt sources (or none answering).
#
# Cache (reused by later runs): /var/cache/dstrain/fresh-debian/ holds a tarball of the
# bootstrapped tree and the .deb files the runs downloaded (as apt's own cache would).
# Each run unpacks the tarball into a new directory, so every run starts from a fresh root.
# Mounts and the root are removed on every exit path (trap), and any process left inside is
# killed first; a root left by a check killed outright is removed by the next one.
set -euo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${DS_FRESH_CACHE:-/var/cache/dstrain/fresh-debian}
TIMEOUT_S=${DS_FRESH_TIMEOUT:-1500}   # per run: install + build + job
SUITE=bookworm
T0=$(date +%s)
say() { echo "check_fresh_debian [+$(( $(date +%s) - T0 ))s]: $*"; }
die() { echo "check_fresh_debian: error: $*" >&2; exit 1; }
skip() { echo "check_fresh_debian: SKIPPED: $*"; exit 77; }

cuda=auto commit=HEAD
while [ $# -gt 0 ]; do
  case "$1" in
    --cuda) cuda=${2:?--cuda needs auto, on or off}; shift 2 ;;
    --commit) commit=${2:?--commit needs a revision}; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "check_fresh_debian: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$cuda" in auto|on|off) ;; *) echo "check_fresh_debian: error: --cuda must be auto, on or off" >&2; exit 2 ;; esac

[ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot and mounts)"
command -v debootstrap >/dev/null || die "debootstrap is not installed (run: scripts/install_deps.sh)"
command -v git >/dev/null || die "git is not installed (run: scripts/install_deps.sh)"
rev=$(git -C "$SRC" rev-parse --verify "$commit^{commit}" 2>/dev/null) || die "'$commit' is not a commit of $SRC"
if [ -n "$(git -C "$SRC" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  say "note: the work tree has uncommitted changes; the check runs commit $rev as committed"
fi

# ---- the mirror, from the host's apt sources (one-line and deb822 formats) -----------------
# Prints "URI SUITE" for every Debian source of the bookworm family with the main component.
apt_sources() {
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -f "$f" ] || continue
    awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                       print $i, $(i + 1) }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] || continue
    awk 'function flush() { if (types ~ /(^| )deb( |$)/) { n = split(uris, u, " "); m = split(suites, s, " ")
                             for (a = 1; a <= n; a++) for (b = 1; b <= m; b++) print u[a], s[b] }
                           types = uris = suites = "" }
         /^[ \t]*$/ { flush(); next }
         /^Types:/  { sub(/^Types:[ \t]*/, ""); types = $0 }
         /^URIs:/   { sub(/^URIs:[ \t]*/, ""); uris = $0 }
         /^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
         END { flush() }' "$f"
  done
}
mapfile -t SOURCES < <(apt_sources | awk -v s="$SUITE" '$2 == s || $2 == s "-updates" || $2 == s "-security"' | sort -u)
MIRROR=
for line in "${SOURCES[@]}"; do
  [ "${line#* }" = "$SUITE" ] && { MIRROR=${line%% *}; break; }
done
[ -n "$MIRROR" ] || skip "no Debian $SUITE mirror in the host's apt sources (/etc/apt/sources.list*)"
MIRROR=${MIRROR%/}
probe=$(mktemp)
if ! timeout 60 /usr/lib/apt/apt-helper download-file "$MIRROR/dists/$SUITE/Release" "$probe" >/dev/null 2>&1; then
  rm -f "$probe"
  skip "the Debian mirror $MIRROR (from the host's apt sources) does not answer"
fi
rm -f "$probe"

# ---- the bootstrapped tree, cached as a tarball --------------------------------------------
mkdir -p "$CACHE/archives/partial"
TARBALL=$CACHE/$SUITE-minbase.tar
exec 9>"$CACHE/lock"
# One check at a time per cache (the tarball, apt's archive directory, stale roots). The jobs it
# starts do not inherit the lock (9>&-): one orphaned by a killed check must not hold it.
flock 9
if [ ! -s "$TARBALL" ]; then
  say "bootstrapping Debian $SUITE (minbase) from $MIRROR into the cache (once)"
  boot=$(mktemp -d /var/tmp/dstrain-bootstrap.XXXXXX)
  trap 'rm -rf "$boot"' EXIT
  if ! debootstrap --variant=minbase "$SUITE" "$boot" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 9>&-; then
    tail -n 20 "$CACHE/debootstrap.log" >&2
    die "debootstrap failed (log: $CACHE/debootstrap.log)"
  fi
  # What a new machine's apt knows: the host's bookworm sources (updates and security too).
  : >"$boot/etc/apt/sources.list"
  for line in "${SOURCES[@]}"; do
    echo "deb ${line%% *} ${line#* } main" >>"$boot/etc/apt/sources.list"
  done
  rm -rf "$boot/var/cache/apt/archives/"*.deb
  tar -C "$boot" -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
  rm -rf "$boot"
  trap - EXIT
fi
say "bootstrapped tree: $TARBALL ($(du -h "$TARBALL" | cut -f1))"

# ---- one run: a fresh root, the commit cloned into it, the README's first command ----------
ROOT=
CHILD=
# remove_root DIR: kills what still runs inside DIR (a hung job, a daemon a package started),
# unmounts everything under it (deepest first) and removes it. Fails if a mount stays.
remove_root() {
  local dir=$1 pid m
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(readlink "/proc/$pid/root" 2>/dev/null)" = "$dir" ] && kill -KILL "$pid" 2>/dev/null || true
  done
  for m in $(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  if awk -v d="$dir/" 'index($2, d) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
    echo "check_fresh_debian: error: mounts left under $dir; not removing it" >&2
    return 1
  fi
  rm -rf --one-file-system "$dir"
}
cleanup() {
  local rc=$?
  [ -n "$CHILD" ] && kill -TERM "$CHILD" 2>/dev/null || true
  CHILD=
  if [ -n "$ROOT" ] && [ -d "$ROOT" ]; then remove_root "$ROOT" || rc=1; fi
  ROOT=
  return $rc
}
trap 'cleanup' EXIT
trap 'exit 130' INT TERM HUP
# Roots left by a check that was killed outright (SIGKILL: no trap ran). The cache lock is
# ours, so no other check is using them.
for stale in /var/tmp/dstrain-fresh.??????; do
  [ -d "$stale" ] || continue
  say "removing the root of an earlier check that was killed: $stale"
  remove_root "$stale"
done

mnt() {  # mnt TARGET mount-args...: mount (cleanup finds every mount under the root)
  local target=$1; shift
  mkdir -p "$target"
  mount "$@" "$target"
}

run_once() {  # run_once NAME WITH_CUDA(0|1)
  local name=$1 with_cuda=$2 log rc=0
  ROOT=$(mktemp -d /var/tmp/dstrain-fresh.XXXXXX)
  log=$CACHE/run-$name.log
  tar -C "$ROOT" -xf "$TARBALL"
  cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true
  mnt "$ROOT/proc" -t proc proc
  mnt "$ROOT/sys" -t sysfs sysfs
  mnt "$ROOT/dev" --bind /dev
  mnt "$ROOT/dev/shm" -t tmpfs -o mode=1777 tmpfs   # Open MPI's shared-memory transport
  mnt "$ROOT/var/cache/apt/archives" --bind "$CACHE/archives"
  if [ "$with_cuda" = 1 ]; then
    mnt "$ROOT/usr/local/cuda" --bind /usr/local/cuda
    mount -o remount,bind,ro "$ROOT/usr/local/cuda"
  fi
  git clone -q --no-checkout "$SRC" "$ROOT/root/dstrain"
  git -C "$ROOT/root/dstrain" checkout -q "$rev"
  say "$name: running scripts/run_default.sh in a fresh Debian $SUITE root (log: $log)"
  # In the background so that a signal to this script runs its trap at once (bash defers traps
  # until a foreground command ends).
  timeout -k 10 "$TIMEOUT_S" chroot "$ROOT" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    /bin/bash -c 'cd /root/dstrain && bash scripts/run_default.sh' </dev/null >"$log" 2>&1 9>&- &
  CHILD=$!
  wait "$CHILD" || rc=$?
  CHILD=
  local fail=
  if [ "$rc" = 124 ]; then fail="timed out after ${TIMEOUT_S}s"
  elif [ "$rc" != 0 ]; then fail="scripts/run_default.sh exited $rc"
  elif ! grep -qE 'final validation loss [0-9.]+' "$log"; then fail="the main job printed no final validation loss"
  elif [ -e "$ROOT/usr/sbin/policy-rc.d" ]; then fail="install_deps.sh left /usr/sbin/policy-rc.d behind"
  elif [ "$with_cuda" = 1 ] && ! grep -q 'Building CUDA object' "$log"; then
    fail="the build compiled no CUDA code with the toolkit at /usr/local/cuda"
  elif [ "$with_cuda" = 0 ] && grep -q 'Building CUDA object' "$log"; then
    fail="the CPU-only build compiled CUDA code"
  fi
  if [ -n "$fail" ]; then
    tail -n 40 "$log" >&2
    echo "check_fresh_debian: error: $name: $fail (whole log: $log)" >&2
    return 1
  fi
  say "$name: passed: $(grep -oE 'final validation loss [0-9.]+' "$log" | tail -n 1)"
  cleanup
}

runs=()
if [ "$cuda" != off ] && [ -x /usr/local/cuda/bin/nvcc ]; then runs+=(cuda); fi
[ "$cuda" = on ] && [ ${#runs[@]} = 0 ] && die "--cuda on, but the host has no /usr/local/cuda/bin/nvcc"
[ "$cuda" = auto ] && [ ${#runs[@]} = 0 ] && say "the host has no /usr/local/cuda: the CPU-only run alone"
runs+=(cpu)
for r in "${runs[@]}"; do
  if [ "$r" = cuda ]; then run_once with-cuda 1; else run_once cpu-only 0; fi
done
say "all runs passed (${runs[*]}) at commit $rev"
