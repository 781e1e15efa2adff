#!/usr/bin/env bash
# End-to-end dsrun tests through real mpirun. Usage: e2e.sh <case>; env from ctest:
# DS_BINARY_DIR, DS_SOURCE_DIR (see tests/launcher/CMakeLists.txt).
set -euo pipefail
case_name=${1:?case}
DSRUN=${DSRUN:-$DS_BINARY_DIR/apps/dsrun/dsrun}
HELLO=${HELLO:-$DS_BINARY_DIR/tests/launcher/ds_launch_hello}
SRC=${DS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
export DS_PYTHON=/usr/bin/python3
T=$(mktemp -d /tmp/dsrun_e2e.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# Waits (bounded) until N pid files exist; polling a condition, not a timed sleep.
wait_pids() {
  local dir=$1 n=$2 i
  for i in $(seq 1 600); do
    [ "$(ls "$dir"/*.pid 2>/dev/null | wc -l)" -ge "$n" ] && return 0
    sleep 0.1
  done
  fail "ranks did not start ($(ls "$dir"))"
}
# True when none of the pids in dir/*.pid is alive (zombies count as gone).
all_gone() {
  local f p st
  for f in "$1"/*.pid; do
    p=$(cat "$f")
    if [ -r /proc/$p/stat ]; then
      st=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f1)
      [ "$st" = Z ] || { echo "pid $p still alive (state $st)"; return 1; }
    fi
  done
  return 0
}
check_hello() {  # file nranks
  local out=$1 n=$2 r
  [ "$(grep -c '^hello ' "$out")" = "$n" ] || { cat "$out"; fail "expected $n hello lines"; }
  for r in $(seq 0 $((n - 1))); do
    grep -q "^hello rank=$r size=$n sum=$((n * (n + 1) / 2)) expect=$((n * (n + 1) / 2)) .* RANK=$r LOCAL_RANK=$r WORLD_SIZE=$n LOCAL_SIZE=$n CROSS_RANK=0 CROSS_SIZE=1 MASTER_ADDR=localhost MASTER_PORT=29511 .*args=--local_rank=$r|x|a b" "$out" \
      || { cat "$out"; fail "rank $r line wrong"; }
  done
}

case $case_name in
  ranks2|ranks4)
    n=${case_name#ranks}
    printf 'localhost slots=%s\n' "$n" > "$T/hf"
    "$DSRUN" --hostfile "$T/hf" --master_port 29511 "$HELLO" x 'a b' > "$T/out" 2>&1 || { cat "$T/out"; fail "rc $?"; }
    check_hello "$T/out" "$n"
    ;;
  include)  # include picks slots 1,3 of 4: 2 ranks, CUDA_VISIBLE_DEVICES=1,3, LOCAL_RANK 0/1
    printf 'localhost slots=4\n' > "$T/hf"
    "$DSRUN" -H "$T/hf" -i localhost:3,1 --no_local_rank "$HELLO" > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    grep -q "rank=1 size=2 .*LOCAL_RANK=1 WORLD_SIZE=2 LOCAL_SIZE=2 .*CUDA_VISIBLE_DEVICES=1,3 netns=.* args=$" "$T/out" || { cat "$T/out"; fail "include"; }
    ;;
  python)  # a plain Python script (no MPI) under dsrun gets DeepSpeed's variables
    printf 'localhost slots=2\n' > "$T/hf"
    mkdir "$T/o"
    DS_PRINT_ENV_DIR=$T/o "$DSRUN" -H "$T/hf" "$SRC/tests/launcher/print_env.py" --user-arg 'sp ace' > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    /usr/bin/python3 - "$T/o" <<'PY'
import json, sys
d = sys.argv[1]
for r in range(2):
    j = json.load(open(f"{d}/{r}.json"))
    assert j["argv"][1:] == [f"--local_rank={r}", "--user-arg", "sp ace"], j["argv"]
    e = j["env"]
    want = {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_SIZE": "2", "CROSS_RANK": "0",
            "CROSS_SIZE": "1", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500", "CUDA_VISIBLE_DEVICES": "0,1"}
    for k, v in want.items():
        assert e.get(k) == v, (r, k, e.get(k), v)
print("python ranks ok")
PY
    ;;
  envfile)  # .deepspeed_env from $HOME then cwd (cwd wins); values arrive byte-for-byte
    mkdir -p "$T/home" "$T/work" "$T/o"
    printf 'localhost slots=2\n' > "$T/hf"
    {
      printf '# comment line\n\n'
      printf 'DS_T_SPACES=  two  spaces  \n'
      printf 'DS_T_QUOTES="double" '"'"'single'"'"' \\"esc\\"\n'
      printf 'DS_T_DOLLAR=$HOME ${X} $(id) `id` ;|&<>*?~!\n'
      printf 'DS_T_EQ=a=b==c\n'
      printf 'DS_T_OVERRIDE=home\n'
      printf 'DS_T_UTF8=caf\xc3\xa9 \xe2\x82\xac\n'
      printf 'DS_T_EMPTY=\n'
    } > "$T/home/.deepspeed_env"
    printf 'DS_T_OVERRIDE=cwd wins\r\n   # indented comment\nDS_T_CWD_ONLY=1\n' > "$T/work/.deepspeed_env"
    (cd "$T/work" && HOME=$T/home NCCL_T_PREFIX='n c c l $x' DS_PRINT_ENV_DIR=$T/o \
       "$DSRUN" -H "$T/hf" --force_multi --no_ssh_check --launcher_args "--mca btl_tcp_if_include lo" \
       "$SRC/tests/launcher/print_env.py") > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    /usr/bin/python3 - "$T/o" "$T/work" <<'PY'
import json, sys
d, work = sys.argv[1], sys.argv[2]
want = {
    "DS_T_SPACES": "  two  spaces  ",
    "DS_T_QUOTES": "\"double\" 'single' \\\"esc\\\"",
    "DS_T_DOLLAR": "$HOME ${X} $(id) `id` ;|&<>*?~!",
    "DS_T_EQ": "a=b==c",
    "DS_T_OVERRIDE": "cwd wins",
    "DS_T_UTF8": "caf\u00e9 \u20ac",
    "DS_T_EMPTY": "",
    "DS_T_CWD_ONLY": "1",
    "NCCL_T_PREFIX": "n c c l $x",
    "UCX_TLS": "tcp",
}
for r in range(2):
    e = json.load(open(f"{d}/{r}.json", encoding="utf-8"))["env"]
    for k, v in want.items():
        assert e.get(k) == v, (r, k, e.get(k), v)
    assert e["PYTHONPATH"].split(":")[0] == work, e["PYTHONPATH"]
print("env byte-for-byte ok")
PY
    # DS_ENV_FILE names the file; a malformed line is an error naming file and line.
    printf 'GOOD=1\nthis line is bad\n' > "$T/work/custom.env"
    if (cd "$T/work" && HOME=$T/home DS_ENV_FILE=custom.env "$DSRUN" -H "$T/hf" "$HELLO") > "$T/err" 2>&1; then
      fail "malformed env file accepted"
    fi
    grep -q "custom.env:2: malformed line" "$T/err" || { cat "$T/err"; fail "env error message"; }
    # A DS_ENV_FILE found nowhere is an error naming where it was looked for; an empty one a
    # warning; the default .deepspeed_env may be missing without a word.
    if (cd "$T/work" && HOME=$T/home DS_ENV_FILE=typo.env "$DSRUN" --dry_run -H "$T/hf" "$HELLO") > "$T/err" 2>&1; then
      fail "missing DS_ENV_FILE accepted"
    fi
    grep -q "dsrun: error: DS_ENV_FILE: environment file $T/home/typo.env or $T/work/typo.env does not exist" "$T/err" \
      || { cat "$T/err"; fail "missing DS_ENV_FILE message"; }
    : > "$T/work/empty.env"
    (cd "$T/work" && HOME=$T/home DS_ENV_FILE=empty.env "$DSRUN" --dry_run -H "$T/hf" "$HELLO") > "$T/out" 2>&1 \
      || { cat "$T/out"; fail "empty DS_ENV_FILE refused"; }
    grep -q "dsrun: warning: DS_ENV_FILE: environment file $T/work/empty.env sets no variable (it is empty)" "$T/out" \
      || { cat "$T/out"; fail "empty DS_ENV_FILE: no warning"; }
    rm -f "$T/home/.deepspeed_env" "$T/work/.deepspeed_env"
    (cd "$T/work" && HOME=$T/home "$DSRUN" --dry_run -H "$T/hf" "$HELLO") > "$T/out" 2>&1 || { cat "$T/out"; fail "no .deepspeed_env refused"; }
    if grep -q "deepspeed_env" "$T/out"; then cat "$T/out"; fail "a missing default .deepspeed_env was reported"; fi
    ;;
  failure)  # rank 1 exits 7: the others are stopped, dsrun exits 7, no rank is left
    printf 'localhost slots=4\n' > "$T/hf"
    mkdir "$T/p"
    rc=0
    DS_HELLO_PID_DIR=$T/p DS_HELLO_FAIL_RANK=1 DS_HELLO_FAIL_CODE=7 "$DSRUN" -H "$T/hf" "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 7 ] || { cat "$T/out"; fail "exit code $rc, want 7"; }
    [ "$(ls "$T/p"/*.pid | wc -l)" = 4 ] || fail "not all ranks started"
    all_gone "$T/p" || fail "ranks left behind after failure"
    ;;
  signal)  # SIGTERM (and SIGINT) to dsrun stop every rank; nothing is left behind
    for sig in TERM INT; do
      printf 'localhost slots=4\n' > "$T/hf"
      rm -rf "$T/p"; mkdir "$T/p"
      DS_HELLO_PID_DIR=$T/p DS_HELLO_BLOCK=1 "$DSRUN" -H "$T/hf" "$HELLO" > "$T/out" 2>&1 &
      dpid=$!
      wait_pids "$T/p" 4
      start=$(date +%s)
      kill -$sig $dpid
      rc=0; wait $dpid || rc=$?
      took=$(( $(date +%s) - start ))
      [ "$rc" -ge 128 ] || { cat "$T/out"; fail "SIG$sig: dsrun rc $rc"; }
      all_gone "$T/p" || fail "SIG$sig: ranks left behind"
      echo "SIG$sig: dsrun rc=$rc after ${took}s, all 4 ranks gone"
      [ "$took" -le 45 ] || fail "SIG$sig: took ${took}s (escalation to SIGKILL is at 10 s)"
    done
    ;;
  sigkill)  # SIGKILL to dsrun (nothing to forward): mpirun and every rank still go away
    printf 'localhost slots=2\n' > "$T/hf"
    mkdir "$T/p"
    DS_HELLO_PID_DIR=$T/p DS_HELLO_BLOCK=1 "$DSRUN" -H "$T/hf" "$HELLO" > "$T/out" 2>&1 &
    dpid=$!
    wait_pids "$T/p" 2
    # The engine: dsrun's child (found by parent pid, so nothing unrelated is touched).
    epid=$(ps -o pid= --ppid "$dpid" | tr -d ' ' | head -1)
    [ -n "$epid" ] || fail "no engine process under dsrun $dpid"
    echo "$epid" > "$T/p/engine.pid"
    # Anything left when the test ends (also on failure) is ours: stop it by pid, after
    # checking the pid still runs our program (not a reused pid).
    trap 'for f in "$T"/p/*.pid; do p=$(cat "$f"); tr "\0" " " < /proc/$p/cmdline 2>/dev/null \
            | grep -qE "ds_launch_hello|mpirun" && kill -KILL "$p" 2>/dev/null; done; rm -rf "$T"' EXIT
    kill -KILL "$dpid"
    wait "$dpid" 2>/dev/null || true
    for i in $(seq 1 300); do  # bounded wait: 30 s
      all_gone "$T/p" > /dev/null && break
      sleep 0.1
    done
    all_gone "$T/p" || fail "engine or ranks left running after SIGKILL of dsrun"
    echo "SIGKILL: engine $epid and both ranks gone"
    ;;
  unreachable)  # an unresolvable host fails fast with a clear message (ssh check, then mpirun)
    printf 'localhost slots=1\nnosuchhost.invalid slots=1\n' > "$T/hf"
    rc=0; "$DSRUN" -H "$T/hf" --force_multi -i nosuchhost.invalid "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" != 0 ] || fail "unreachable host accepted"
    grep -q "host 'nosuchhost.invalid' is unreachable" "$T/out" || { cat "$T/out"; fail "message"; }
    rc=0; "$DSRUN" -H "$T/hf" --no_ssh_check --launcher_args "--mca btl_tcp_if_include lo" "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" != 0 ] || fail "mpirun accepted an unreachable host"
    grep -qi "nosuchhost" "$T/out" || { cat "$T/out"; fail "mpirun message does not name the host"; }
    ;;
  localrank)  # the program's own --local_rank: refused before any rank starts
    printf 'localhost slots=2\n' > "$T/hf"
    mkdir "$T/p"
    rc=0; DS_HELLO_PID_DIR=$T/p "$DSRUN" -H "$T/hf" "$HELLO" x --local_rank=0 > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] || { cat "$T/out"; fail "rc $rc, want 2"; }
    [ "$(wc -l < "$T/out")" = 1 ] || { cat "$T/out"; fail "more than one line"; }
    grep -q "^dsrun: error: the program's arguments contain --local_rank=0 (argument 2 after the program); dsrun adds --local_rank=N to each rank itself (remove it, or pass --no_local_rank to dsrun, which then adds none and passes yours unchanged)" "$T/out" \
      || { cat "$T/out"; fail "message"; }
    [ -z "$(ls "$T/p")" ] || fail "a rank started"
    # With --no_local_rank the program's own flag is the only one.
    "$DSRUN" -H "$T/hf" --no_local_rank "$HELLO" --local_rank=0 > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    [ "$(grep -c 'args=--local_rank=0$' "$T/out")" = 2 ] || { cat "$T/out"; fail "own --local_rank"; }
    ;;
  bigenv)  # an exported variable over one exec argument's limit: named, nothing starts
    printf 'localhost slots=2\n' > "$T/hf"
    mkdir "$T/p" "$T/work"
    one=$(( 32 * $(getconf PAGESIZE) ))
    { printf 'NCCL_T_BIG='; head -c 200000 /dev/zero | tr '\0' x; printf '\n'; } > "$T/work/.deepspeed_env"
    rc=0; (cd "$T/work" && HOME=$T/work DS_HELLO_PID_DIR=$T/p "$DSRUN" -H "$T/hf" "$HELLO") > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] || { cat "$T/out"; fail "rc $rc, want 2"; }
    [ "$(wc -l < "$T/out")" = 1 ] || { cat "$T/out"; fail "more than one line"; }
    grep -q "^dsrun: error: environment variable NCCL_T_BIG is 200011 bytes (NCCL_T_BIG=VALUE), over the $((one - 1))-byte limit of one exec argument" "$T/out" \
      || { cat "$T/out"; fail "message"; }
    [ -z "$(ls "$T/p")" ] || fail "a rank started"
    ;;
  execfail)  # the engine cannot be executed: one line naming it and the reason, exit 127
    printf 'localhost slots=2\n' > "$T/hf"
    mkdir "$T/bin"
    printf '#!/nonexistent/interpreter\n' > "$T/bin/mpirun"
    printf '#!/bin/sh\n' > "$T/bin/ompi_info"
    chmod +x "$T/bin/mpirun" "$T/bin/ompi_info"
    # PATH holds only the stand-ins (execvp would go on to a real mpirun after ENOENT).
    rc=0; PATH=$T/bin "$DSRUN" -H "$T/hf" "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 127 ] || { cat "$T/out"; fail "rc $rc, want 127"; }
    [ "$(cat "$T/out")" = "dsrun: error: cannot execute 'mpirun': No such file or directory" ] \
      || { cat "$T/out"; fail "message"; }
    ;;
  ranklog)  # --enable_each_rank_log DIR: one DIR/<timestamp>_rank<R>.log per rank, nothing on the terminal
    printf 'localhost slots=2\n' > "$T/hf"
    (cd "$T" && "$DSRUN" -H "$T/hf" --master_port 29511 --enable_each_rank_log logs/sub "$HELLO" x 'a b') > "$T/out" 2>&1 \
      || { cat "$T/out"; fail "rc"; }
    ! grep -q '^hello' "$T/out" || { cat "$T/out"; fail "rank output reached the terminal"; }
    grep -q "^dsrun: each rank's output goes to $T/logs/sub/[0-9]\{14\}_rank<RANK>.log$" "$T/out" || { cat "$T/out"; fail "note"; }
    [ "$(ls "$T/logs/sub" | wc -l)" = 2 ] || { ls "$T/logs/sub"; fail "want 2 log files"; }
    for r in 0 1; do
      f=$(ls "$T"/logs/sub/*_rank$r.log)
      [[ $(basename "$f") =~ ^[0-9]{14}_rank$r\.log$ ]] || fail "log name $f"
      [ "$(grep -c '^hello ' "$f")" = 1 ] || { cat "$f"; fail "rank $r log"; }
      grep -q "^hello rank=$r size=2 .* RANK=$r LOCAL_RANK=$r .*args=--local_rank=$r|x|a b$" "$f" || { cat "$f"; fail "rank $r line"; }
    done
    # A file where the directory should be: refused before anything starts.
    rc=0; "$DSRUN" -H "$T/hf" --enable_each_rank_log "$T/hf" "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] && grep -q "^dsrun: error: --enable_each_rank_log: '$T/hf' exists and is not a directory" "$T/out" \
      || { cat "$T/out"; fail "file as log dir: rc $rc"; }
    ;;
  bind)  # --bind_core_list / --bind_cores_to_rank: each local rank runs on its share of the cores
    printf 'localhost slots=2\n' > "$T/hf"
    first2=$(taskset -cp $$ | sed 's/.*: //' | tr ',' '\n' | awk -F- '{ if (NF == 2) for (i = $1; i <= $2; i++) print i; else print $1 }' | head -2)
    c0=$(echo "$first2" | sed -n 1p); c1=$(echo "$first2" | sed -n 2p)
    [ -n "$c1" ] || { echo "SKIP: needs 2 usable cores"; exit 77; }  # (nproc obeys OMP_NUM_THREADS)
    DS_HELLO_CPUS=1 "$DSRUN" -H "$T/hf" --bind_core_list "$c0,$c1" "$HELLO" > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    grep -q "^cpus rank=0 allowed=$c0 omp=1$" "$T/out" && grep -q "^cpus rank=1 allowed=$c1 omp=1$" "$T/out" \
      || { cat "$T/out"; fail "--bind_core_list $c0,$c1"; }
    # Without a list: the cores dsrun may use, shared out in order.
    DS_HELLO_CPUS=1 "$DSRUN" -H "$T/hf" --bind_cores_to_rank "$HELLO" > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    grep -q "^cpus rank=0 allowed=$c0 omp=1$" "$T/out" || { cat "$T/out"; fail "--bind_cores_to_rank"; }
    # A core this machine does not have: one line before launching ...
    rc=0; "$DSRUN" -H "$T/hf" --bind_core_list "$c0,1000" "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] && grep -q "^dsrun: error: --bind_core_list $c0,1000: core(s) 1000 are not available on this machine" "$T/out" \
      || { cat "$T/out"; fail "missing core: rc $rc"; }
    # ... and, in multi-node mode (checked by each rank on its host), the rank says which.
    rc=0; "$DSRUN" -H "$T/hf" --force_multi --no_ssh_check --launcher_args "--mca btl_tcp_if_include lo" \
      --bind_core_list "$c0,1000" "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" != 0 ] && grep -q "dsrun: error: core binding: local rank 1 on host 'localhost' should run on cores 1000 but this host lets it use none of them" "$T/out" \
      || { cat "$T/out"; fail "missing core on a rank: rc $rc"; }
    ;;
  savepid)  # --save_pid: /tmp/<dsrun pid>.deepspeed holds dsrun's pid while it runs, gone after
    printf 'localhost slots=1\n' > "$T/hf"
    printf '#!/bin/sh\nfor f in /tmp/*.deepspeed; do echo "pidfile $f $(cat "$f")"; done\n' > "$T/show.sh"
    chmod +x "$T/show.sh"
    "$DSRUN" -H "$T/hf" --save_pid --no_local_rank "$T/show.sh" > "$T/out" 2>&1 &
    dpid=$!
    rc=0; wait $dpid || rc=$?
    [ "$rc" = 0 ] || { cat "$T/out"; fail "rc $rc"; }
    grep -q "^pidfile /tmp/$dpid.deepspeed $dpid$" "$T/out" || { cat "$T/out"; fail "pid file during the run"; }
    grep -q "^dsrun: pid $dpid saved in /tmp/$dpid.deepspeed$" "$T/out" || { cat "$T/out"; fail "note"; }
    [ ! -e "/tmp/$dpid.deepspeed" ] || fail "pid file left behind"
    # Stopped by a signal (DeepSpeed's case for removing it): the file goes too.
    mkdir "$T/p"
    DS_HELLO_PID_DIR=$T/p DS_HELLO_BLOCK=1 "$DSRUN" -H "$T/hf" --save_pid "$HELLO" > "$T/out" 2>&1 &
    dpid=$!
    wait_pids "$T/p" 1
    [ "$(cat "/tmp/$dpid.deepspeed")" = "$dpid" ] || fail "pid file while running"
    kill -TERM "$dpid"
    rc=0; wait "$dpid" || rc=$?
    [ "$rc" -ge 128 ] || { cat "$T/out"; fail "SIGTERM: rc $rc"; }
    [ ! -e "/tmp/$dpid.deepspeed" ] || fail "pid file left behind after SIGTERM"
    all_gone "$T/p" || fail "rank left running"
    ;;
  sshport)  # --ssh_port reaches the ssh check (a stand-in ssh prints its arguments and fails)
    printf 'localhost slots=1\nnosuchhost.invalid slots=1\n' > "$T/hf"
    mkdir "$T/bin"
    printf '#!/bin/sh\necho "ssh args: $*"\nexit 255\n' > "$T/bin/ssh"
    chmod +x "$T/bin/ssh"
    rc=0; PATH=$T/bin:$PATH "$DSRUN" -H "$T/hf" --force_multi -i nosuchhost.invalid --ssh_port 2222 "$HELLO" > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] || { cat "$T/out"; fail "rc $rc"; }
    grep -q "host 'nosuchhost.invalid' is unreachable with passwordless ssh (ssh args: -o PasswordAuthentication=no -o BatchMode=yes -o ConnectTimeout=10 -p 2222 nosuchhost.invalid hostname)" "$T/out" \
      || { cat "$T/out"; fail "ssh check without the port"; }
    ;;
  module)  # --module: ranks run `python -u -m MODULE`; --no_python: a .py runs itself (shebang)
    printf 'localhost slots=2\n' > "$T/hf"
    mkdir "$T/o" "$T/pkg"
    cp "$SRC/tests/launcher/print_env.py" "$T/pkg/ds_print_env_mod.py"
    (cd "$T/pkg" && DS_PRINT_ENV_DIR=$T/o "$DSRUN" -H "$T/hf" --module ds_print_env_mod --a 1) > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    /usr/bin/python3 - "$T/o" "$T/pkg/ds_print_env_mod.py" <<'PY'
import json, sys
for r in range(2):
    j = json.load(open(f"{sys.argv[1]}/{r}.json"))
    assert j["argv"] == [sys.argv[2], f"--local_rank={r}", "--a", "1"], j["argv"]
print("module ok")
PY
    rm -f "$T"/o/*
    # --no_python: a .py with a shebang is executed itself (no interpreter in front).
    printf '#!/bin/sh\necho "direct rank=$RANK args=$*"\n' > "$T/run.py"
    chmod +x "$T/run.py"
    "$DSRUN" -H "$T/hf" --no_python "$T/run.py" z > "$T/out" 2>&1 || { cat "$T/out"; fail "rc"; }
    grep -q "^direct rank=1 args=--local_rank=1 z$" "$T/out" || { cat "$T/out"; fail "--no_python"; }
    rc=0; "$DSRUN" -H "$T/hf" --module --no_python x > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] || { cat "$T/out"; fail "--module --no_python accepted"; }
    ;;
  backends)  # impi / mvapich outside --dry_run: installed checks, then the engine gets the argv
    printf 'localhost slots=2\n' > "$T/hf"
    mkdir "$T/bin"
    printf '#!/bin/sh\n[ "$1" = --version ] && { echo "mpirun (Open MPI) 4.1.4"; exit 0; }\necho "engine: $*"\n' > "$T/bin/mpirun"
    chmod +x "$T/bin/mpirun"
    rc=0; PATH=$T/bin "$DSRUN" -H "$T/hf" --launcher impi prog > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] && grep -q "^dsrun: error: launcher 'impi' not installed (the mpirun in PATH is not Intel MPI's)" "$T/out" \
      || { cat "$T/out"; fail "impi with Open MPI's mpirun: rc $rc"; }
    rc=0; PATH=$T/bin "$DSRUN" -H "$T/hf" --launcher mvapich prog > "$T/out" 2>&1 || rc=$?
    [ "$rc" = 2 ] && grep -q "^dsrun: error: launcher 'mvapich' not installed (no mpiname in PATH)" "$T/out" \
      || { cat "$T/out"; fail "mvapich without mpiname: rc $rc"; }
    printf '#!/bin/sh\n[ "$1" = --version ] && { echo "Intel(R) MPI Library for Linux* OS, Version 2021.10"; exit 0; }\necho "engine: $*"\n' > "$T/bin/mpirun"
    PATH=$T/bin "$DSRUN" -H "$T/hf" --launcher impi prog a > "$T/out" 2>&1 || { cat "$T/out"; fail "impi rc"; }
    grep -q "^engine: -n 2 -ppn 2 -hosts localhost .*-genv I_MPI_PIN 0 .*--rank_shim .* -- prog a$" "$T/out" || { cat "$T/out"; fail "impi argv"; }
    printf '#!/bin/sh\necho "MVAPICH2 2.3.7"\n' > "$T/bin/mpiname"
    chmod +x "$T/bin/mpiname"
    PATH=$T/bin "$DSRUN" -H "$T/hf" --launcher mvapich prog > "$T/out" 2>&1 || { cat "$T/out"; fail "mvapich rc"; }
    grep -q "^engine: -n 2 -ppn 2 -hosts localhost -genv MV2_SMP_USE_CMA 0 .*--rank_shim .* -- prog$" "$T/out" || { cat "$T/out"; fail "mvapich argv"; }
    ;;
  train)  # the real train app under dsrun: 2 ranks, 2 steps, small model
    printf 'localhost slots=2\n' > "$T/hf"
    "$DSRUN" -H "$T/hf" "$DS_BINARY_DIR/apps/train/train" --config "$SRC/configs/default.json" --steps 2 \
      --eval_iters 0 --n_layer 1 --sample_tokens 0 > "$T/out" 2>&1 || { cat "$T/out"; fail "train rc"; }
    cat "$T/out"
    grep -q "world size 2" "$T/out" || fail "train did not run on 2 ranks"
    grep -q "done: 2 steps" "$T/out" || fail "train did not finish 2 steps"
    ;;
  *) fail "unknown case $case_name" ;;
esac
echo "PASS $case_name"
