#!/usr/bin/env python3
"""dsrun --dry_run contract: first line is one JSON object {"world_info", "host_order",
"world_size", "master_addr", "master_port"}, second line the command; errors exit non-zero.
Usage: dry_run_test.py <path to dsrun>"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

DSRUN = sys.argv[1]
TMP = tempfile.mkdtemp(prefix="dsrun_dry_")
failures = []


def hostfile(text, name="hf"):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        f.write(text)
    return path


def run(args, env_extra=None, env_drop=("CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID", "SLURM_JOB_NODELIST",
                                        "SLURM_NODELIST", "DS_ENV_FILE", "OMPI_MCA_plm_rsh_args")):
    env = {k: v for k, v in os.environ.items() if k not in env_drop}
    env["HOME"] = TMP  # no stray ~/.deepspeed_env
    env.update(env_extra or {})
    return subprocess.run([DSRUN, "--dry_run"] + args, capture_output=True, text=True, env=env, cwd=TMP,
                          timeout=30)


def ok(args, want_world, want_master=None, port=29500, env=None, check=None):
    p = run(args, env)
    if p.returncode != 0:
        failures.append(f"{args}: rc {p.returncode}: {p.stderr.strip()}")
        return None
    lines = p.stdout.splitlines()
    j = json.loads(lines[0])
    if list(j.keys()) != ["world_info", "host_order", "world_size", "master_addr", "master_port"]:
        failures.append(f"{args}: keys {list(j.keys())}")
    got = list(j["world_info"].items())
    if got != want_world:
        failures.append(f"{args}: world_info {got} != {want_world}")
    if j["host_order"] != [h for h, _ in want_world]:
        failures.append(f"{args}: host_order {j['host_order']}")
    if j["world_size"] != sum(len(s) for _, s in want_world):
        failures.append(f"{args}: world_size {j['world_size']}")
    if want_master is not None and j["master_addr"] != want_master:
        failures.append(f"{args}: master_addr {j['master_addr']} != {want_master}")
    if j["master_port"] != port:
        failures.append(f"{args}: master_port {j['master_port']}")
    argv = shlex.split(lines[1])
    if check:
        check(args, argv)
    return argv


def err(args, needle, env=None):
    p = run(args, env)
    if p.returncode == 0:
        failures.append(f"{args}: expected an error, got rc 0: {p.stdout[:1000]}")
    elif needle not in p.stderr:
        failures.append(f"{args}: error {p.stderr.strip()!r} lacks {needle!r}")


hf2x4 = hostfile("worker-0 slots=4\nworker-1 slots=4\n", "hf2x4")
hf3x4 = hostfile("# cluster\nworker-1 slots=4\nworker-2:4\nworker-3 slots=4 max_slots=8  # note\n", "hf3x4")
W4 = [0, 1, 2, 3]

# Hostfile order, all slots, master = first host, default port.
ok(["--hostfile", hf2x4, "prog"], [("worker-0", W4), ("worker-1", W4)], "worker-0")
ok(["-H", hf3x4, "--exclude=worker-2:0@worker-3:0,1", "prog"],
   [("worker-1", W4), ("worker-2", [1, 2, 3]), ("worker-3", [2, 3])])
ok(["-H", hf2x4, "-i", "worker-1:3,0@worker-0:1,1", "prog"], [("worker-0", [1]), ("worker-1", [0, 3])])
ok(["-H", hf2x4, "--include", "worker-0@worker-1:0,2", "prog"], [("worker-0", W4), ("worker-1", [0, 2])])
ok(["-H", hf2x4, "-e", "worker-1", "prog"], [("worker-0", W4)])
ok(["-H", hf2x4, "--num_nodes", "1", "prog"], [("worker-0", W4)])
ok(["-H", hf2x4, "--num_gpus", "2", "prog"], [("worker-0", [0, 1]), ("worker-1", [0, 1])])
ok(["-H", hf2x4, "--num_accelerators", "1", "--master_addr", "10.0.0.1", "--master_port", "1234", "prog"],
   [("worker-0", [0]), ("worker-1", [0])], "10.0.0.1", 1234)
ok(["-H", hostfile("a slots=0\nb slots=2\n", "hf0"), "prog"], [("a", []), ("b", [0, 1])])

# Everything after PROGRAM is the program's, including dsrun-looking flags.
def passthrough(args, argv):
    i = argv.index("--")
    if argv[i + 1:] != ["prog", "--hostfile", "x", "--foo", "--dry_run"]:
        failures.append(f"passthrough: {argv[i + 1:]}")
ok(["-H", hf2x4, "prog", "--hostfile", "x", "--foo", "--dry_run"], [("worker-0", W4), ("worker-1", W4)],
   check=passthrough)

# The command: multi-node mpirun with hosts:slots, shim with world_info (urlsafe base64 JSON).
def mpirun_multi(args, argv):
    import base64
    if argv[0] != "mpirun" or argv[argv.index("-np") + 1] != "4":
        failures.append(f"mpirun argv {argv}")
    if argv[argv.index("--host") + 1] != "worker-0:2,worker-1:2":
        failures.append(f"--host {argv}")
    wi = [a for a in argv if a.startswith("--world_info=")][0].split("=", 1)[1]
    if json.loads(base64.urlsafe_b64decode(wi)) != {"worker-0": [0, 1], "worker-1": [0, 1]}:
        failures.append(f"world_info b64 {wi}")
    if "--no_local_rank" not in argv or "-x" not in argv:
        failures.append(f"flags {argv}")
ok(["-H", hf2x4, "--num_gpus", "2", "--no_local_rank", "prog"], [("worker-0", [0, 1]), ("worker-1", [0, 1])],
   check=mpirun_multi)

def mpich(args, argv):
    if argv[:7] != ["mpiexec", "-n", "8", "-ppn", "4", "-hosts", "worker-0,worker-1"]:
        failures.append(f"mpich {argv}")
ok(["-H", hf2x4, "--launcher", "MPICH", "prog"], [("worker-0", W4), ("worker-1", W4)], check=mpich)

def slurm(args, argv):
    i = argv.index("srun")
    if argv[0] != "env" or argv[i:i + 6] != ["srun", "-n", "8", "-N", "2", "--ntasks-per-node=4"]:
        failures.append(f"slurm {argv}")
ok(["-H", hf2x4, "--launcher", "slurm", "prog"], [("worker-0", W4), ("worker-1", W4)], check=slurm)

def launcher_args(args, argv):
    if "eth0" in argv or argv[argv.index("btl_tcp_if_include") + 1] != "eth1":
        failures.append(f"launcher_args {argv}")
ok(["-H", hf2x4, "--launcher_args", "--mca btl_tcp_if_include eth1", "prog"],
   [("worker-0", W4), ("worker-1", W4)], check=launcher_args)

# No hostfile (the default path /job/hostfile absent): localhost, 127.0.0.1 even with
# --master_addr; CUDA_VISIBLE_DEVICES -> include. A hostfile named with -H must exist.
nohf = os.path.join(TMP, "missing")
err(["-H", nohf, "prog"], f"hostfile '{nohf}' does not exist")
err(["--hostfile=" + nohf, "prog"], f"hostfile '{nohf}' does not exist")
DEFAULT_HF = not os.path.exists("/job/hostfile")  # the no-hostfile cases need it absent
def local(args, argv):
    if argv[argv.index("--host") + 1] != "localhost:2":
        failures.append(f"local {argv}")
if DEFAULT_HF:
    ok(["--num_gpus", "2", "--master_addr", "10.1.1.1", "prog"], [("localhost", [0, 1])], "127.0.0.1",
       check=local)
    ok(["prog"], [("localhost", [0, 1, 2])], env={"LOCAL_SIZE": "3"})
    ok(["prog"], [("localhost", [0, 2])], env={"LOCAL_SIZE": "4", "CUDA_VISIBLE_DEVICES": "2,0"})
    ok(["--num_gpus", "1", "prog"], [("localhost", [0])], env={"LOCAL_SIZE": "4", "CUDA_VISIBLE_DEVICES": "2"})

    # Slurm allocation without hostfile.
    slurm_env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[08-10]", "SLURM_TASKS_PER_NODE": "2(x3)"}
    ok(["prog"], [("node08", [0, 1]), ("node09", [0, 1]), ("node10", [0, 1])], "node08", env=slurm_env)
    err(["--num_nodes", "2", "prog"], "no hostfile")
else:
    print("/job/hostfile exists: the no-hostfile cases are skipped")

# Errors: non-zero exit and a message naming the problem.
err(["-H", hostfile("", "empty"), "prog"], "hostfile is empty")
err(["-H", hostfile("a slots=1\nb\n", "bad"), "prog"], "bad:2: host 'b' has no slot count")
err(["-H", hostfile("a slots=1\na slots=1\n", "dup"), "prog"], "dup:2: duplicate host 'a'")
err(["-H", hostfile("Worker-1 slots=1\nworker-1 slots=1\n", "dupcase"), "prog"],
    "dupcase:2: duplicate host 'worker-1' (first on line 1 as 'Worker-1'")
err(["-H", hostfile("a slots=x\n", "badn"), "prog"], "badn:1: bad slot count 'x'")
err(["-H", hf2x4, "-i", "worker-0", "-e", "worker-1", "prog"], "mutually exclusive")
err(["-H", hf2x4, "-i", "jeff", "prog"], "host 'jeff' not found")
err(["-H", hf2x4, "-i", "worker-1:4", "prog"], "no slot 4 on host 'worker-1'")
err(["-H", hf2x4, "-e", "worker-0@worker-1", "prog"], "no resources")
err(["-H", hf2x4, "-i", "worker-0", "--num_nodes", "1", "prog"], "cannot combine")
err(["-H", hf2x4, "--num_gpus", "5", "prog"], "exceeds the 4 slots")
err(["-H", hf2x4, "--launcher", "pdsh", "prog"], "--launcher pdsh is not supported: dsrun starts every rank")
err(["-H", hostfile("a slots=1\nb slots=2\n", "uneven"), "--launcher", "mpich", "prog"], "same number of slots")
err(["-H", hf2x4], "no PROGRAM")
err(["-H", hf2x4, "--bogus", "prog"], "unknown option '--bogus'")
def separator(args, argv):
    if argv[argv.index("--") + 1:] != ["prog", "-x"]:
        failures.append(f"separator: {argv}")
ok(["-H", hf2x4, "--", "prog", "-x"], [("worker-0", W4), ("worker-1", W4)], check=separator)
err(["-H", hf2x4, "--master_port", "0", "prog"], "--master_port")
err(["-H", hf2x4, "--launcher_args", "'open", "prog"], "unterminated")
# The program's own --local_rank would clash with the one dsrun adds: refused before
# launching, unless --no_local_rank (then it is passed through as the only one).
LR = "dsrun adds --local_rank=N to each rank itself (remove it, or pass --no_local_rank to dsrun"
err(["-H", hf2x4, "prog", "x", "--local_rank=1"],
    "the program's arguments contain --local_rank=1 (argument 2 after the program); " + LR)
err(["-H", hf2x4, "--", "prog", "--local_rank", "0"], "the program's arguments contain --local_rank (argument 1")
def own_local_rank(args, argv):
    if argv[argv.index("--") + 1:] != ["prog", "--local_rank=1"] or "--no_local_rank" not in argv:
        failures.append(f"own --local_rank: {argv}")
ok(["-H", hf2x4, "--no_local_rank", "prog", "--local_rank=1"], [("worker-0", W4), ("worker-1", W4)],
   check=own_local_rank)
# --include / --exclude match host names without regard to case; the hostfile's spelling stays.
ok(["-H", hf2x4, "-i", "WORKER-1:0@Worker-0", "prog"], [("worker-0", W4), ("worker-1", [0])], "worker-0")
ok(["-H", hf2x4, "-e", "Worker-1", "prog"], [("worker-0", W4)])
# An exported variable too long for one exec argument is named before anything starts.
one = 32 * os.sysconf("SC_PAGESIZE")
with open(os.path.join(TMP, ".deepspeed_env"), "w") as f:
    f.write("NCCL_SMALL=1\nFOO=" + "x" * 200000 + "\n")
err(["-H", hf2x4, "prog"], f"environment variable FOO is 200004 bytes (FOO=VALUE), over the {one - 1}-byte "
    "limit of one exec argument")
os.remove(os.path.join(TMP, ".deepspeed_env"))
with open(os.path.join(TMP, ".deepspeed_env"), "w") as f:
    f.write("OK=1\n\nBAD LINE\n")
err(["-H", hf2x4, "prog"], ".deepspeed_env:3: malformed line")
os.remove(os.path.join(TMP, ".deepspeed_env"))

# DeepSpeed's launcher flags: how the program starts (--module / --no_python reach the shim).
def shim_tail(want):
    def check(args, argv):
        if argv[argv.index("--master_port=29500") + 1:] != want:
            failures.append(f"{args}: shim tail {argv[argv.index('--master_port=29500') + 1:]} != {want}")
    return check
ok(["-H", hf2x4, "--module", "pkg.train", "--lr", "1"], [("worker-0", W4), ("worker-1", W4)],
   check=shim_tail(["--module", "--", "pkg.train", "--lr", "1"]))
ok(["-H", hf2x4, "--no_python", "run.py"], [("worker-0", W4), ("worker-1", W4)],
   check=shim_tail(["--no_python", "--", "run.py"]))
err(["-H", hf2x4, "--module", "--no_python", "x"],
    "--module and --no_python cannot be used together (--module runs `python -u -m MODULE`, --no_python runs "
    "PROGRAM itself)")

# --ssh_port joins Open MPI's ssh arguments (default, --launcher_args value, or the environment's).
def rsh(want):
    def check(args, argv):
        if [argv[i + 1] for i, a in enumerate(argv) if a == "plm_rsh_args"] != [want]:
            failures.append(f"{args}: plm_rsh_args in {argv}")
    return check
W2 = [("worker-0", W4), ("worker-1", W4)]
ok(["-H", hf2x4, "--ssh_port", "2222", "prog"], W2, check=rsh("-o BatchMode=yes -o ConnectTimeout=10 -p 2222"))
ok(["-H", hf2x4, "--ssh_port", "2222", "--launcher_args", "--mca plm_rsh_args '-i k'", "prog"], W2,
   check=rsh("-i k -p 2222"))
ok(["-H", hf2x4, "--ssh_port", "2222", "prog"], W2, env={"OMPI_MCA_plm_rsh_args": "-o A=b"}, check=rsh("-o A=b -p 2222"))
err(["-H", hf2x4, "--ssh_port", "0", "prog"], "--ssh_port 0 is not a port (1-65535)")
err(["-H", hf2x4, "--ssh_port", "22", "--launcher", "mpich", "prog"], "--ssh_port works with --launcher openmpi only")

# Core binding: the list reaches every rank's shim, normalised; bad lists are named.
ok(["-H", hf2x4, "--bind_core_list", "0,2-4,6,8-9", "prog"], W2,
   check=shim_tail(["--bind_cores=0,2-4,6,8-9", "--", "prog"]))
ok(["-H", hf2x4, "--bind_cores_to_rank", "prog"], W2, check=shim_tail(["--bind_cores=", "--", "prog"]))
err(["-H", hf2x4, "--bind_core_list", "0,2-6,5-9", "prog"],
    "--bind_core_list '0,2-6,5-9': '5-9' overlaps or comes before the previous item")
err(["-H", hf2x4, "--bind_core_list", "1,6-2", "prog"], "--bind_core_list '1,6-2': range '6-2' runs backwards")
err(["-H", hf2x4, "--bind_core_list", "0-2", "prog"], "3 core(s) (0-2) for 4 local ranks; every rank needs at least one core")

# --enable_each_rank_log: the per-rank file prefix reaches the shim; dry run creates nothing.
def rank_log(args, argv):
    v = [a for a in argv if a.startswith("--rank_log=")]
    import re
    if len(v) != 1 or not re.fullmatch(r"--rank_log=" + re.escape(TMP) + r"/logs/\d{14}_rank", v[0]):
        failures.append(f"{args}: rank log {v}")
    if os.path.exists(os.path.join(TMP, "logs")):
        failures.append(f"{args}: dry run created the log directory")
ok(["-H", hf2x4, "--enable_each_rank_log", "logs", "prog"], W2, check=rank_log)
ok(["-H", hf2x4, "--enable_each_rank_log", "None", "prog"], W2,
   check=lambda args, argv: any(a.startswith("--rank_log") for a in argv) and failures.append(f"{args}: {argv}"))
err(["-H", hf2x4, "--enable_each_rank_log", hf2x4, "prog"], f"--enable_each_rank_log: '{hf2x4}' exists and is not a directory")

# Log level: debug shows the command; bad names are refused; -q is error level.
p = run(["-H", hf2x4, "--log_level", "DEBUG", "prog"])
if p.returncode != 0 or not p.stderr.startswith("dsrun: command: mpirun "):
    failures.append(f"--log_level DEBUG: rc {p.returncode} stderr {p.stderr!r}")
err(["-H", hf2x4, "--log_level", "loud", "prog"], "--log_level 'loud' is not one of debug, info, warning, error, critical")
err(["-H", hf2x4, "-q", "--log_level", "info", "prog"], "-q/--quiet means --log_level error")
if DEFAULT_HF:
    for args, want_note in ((["--num_gpus", "1", "prog"], True), (["-q", "--num_gpus", "1", "prog"], False),
                            (["--log_level", "error", "--num_gpus", "1", "prog"], False)):
        p = run(args, {"LOCAL_SIZE": "2", "CUDA_VISIBLE_DEVICES": "1"})
        if p.returncode != 0 or ("ignoring CUDA_VISIBLE_DEVICES" in p.stderr) != want_note:
            failures.append(f"{args}: rc {p.returncode}, note shown {not want_note}: {p.stderr!r}")

# Intel MPI and MVAPICH2 back ends (Hydra forms; neither MPI is installed here).
def impi(args, argv):
    if argv[:7] != ["mpirun", "-n", "8", "-ppn", "4", "-hosts", "worker-0,worker-1"] or \
            argv[argv.index("I_MPI_PIN") - 1:argv.index("I_MPI_PIN") + 2] != ["-genv", "I_MPI_PIN", "0"]:
        failures.append(f"impi {argv}")
ok(["-H", hf2x4, "--launcher", "impi", "prog"], W2, check=impi)
def mvapich(args, argv):
    if argv[:7] != ["mpirun", "-n", "8", "-ppn", "4", "-hosts", "worker-0,worker-1"] or \
            "MV2_ENABLE_AFFINITY" not in argv:
        failures.append(f"mvapich {argv}")
ok(["-H", hf2x4, "--launcher", "MVAPICH", "prog"], W2, check=mvapich)
err(["-H", hostfile("a slots=1\nb slots=2\n", "uneven2"), "--launcher", "impi", "prog"],
    "--launcher impi requires the same number of slots on every host")

# DeepSpeed flags dsrun cannot honour: refused with the reason, never "unknown option".
for args, needle in (
        (["--no_ssh", "--node_rank", "1"], "--no_ssh (one launch per node, met through MASTER_ADDR) is not supported"),
        (["--node_rank", "0"], "--node_rank (for --no_ssh per-node launches) is not supported"),
        (["--venv_script", "v.sh"], "--venv_script is for DeepSpeed's pdsh launcher"),
        (["--elastic_training"], "--elastic_training is not supported"),
        (["--min_elastic_nodes", "1"], "--min_elastic_nodes is not supported"),
        (["--max_elastic_nodes", "2"], "--max_elastic_nodes is not supported"),
        (["--autotuning", "run"], "--autotuning is not supported")):
    err(["-H", hf2x4] + args + ["prog"], needle)

if failures:
    print("\n".join(failures))
    sys.exit(1)
print("dry-run contract: all checks passed")
