"""ds_report --json: the JSON contract, the `distributed` object under the environments of
several launchers (from the environment alone, --no_mpi), a malformed environment, the human
form, and real ranks under mpirun -np 2.

Run: /usr/bin/python3 tests/mpi/test_ds_report.py build/apps/ds_report/ds_report
"""
import json
import os
import subprocess
import sys

exe = sys.argv[1]
KEYS = {"version", "compiler", "mpi", "hdf5", "cuda", "nccl", "torch", "cpu", "distributed"}
DIST = {"rank", "world_size", "local_rank", "local_size", "node_rank", "master_addr", "master_port", "source"}
# Start from a clean environment: no launcher variables from whoever runs the test.
BASE = {k: v for k, v in os.environ.items()
        if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "SLURM_", "MV2_", "PALS_", "AZ", "SM_"))
        and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_SIZE")}


def report(extra, *args):
    env = dict(BASE, **extra)
    out = subprocess.run([exe, "--json", *args], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = [l for l in out.stdout.splitlines() if l.strip()]
    assert len(lines) == 1, out.stdout
    r = json.loads(lines[0])
    assert KEYS <= set(r), set(r)
    assert DIST <= set(r["distributed"]), r["distributed"]
    assert set(r["cpu"]) >= {"features", "threads"} and r["cpu"]["threads"] >= 1
    assert r["mpi"]["library"] and r["hdf5"].count(".") == 2
    assert r["torch"] is None or r["torch"].count(".") == 2, r["torch"]
    return r


def dist(extra):
    return report(extra, "--no_mpi")["distributed"]


def expect(d, **kv):
    for k, v in kv.items():
        assert d[k] == v, (k, d[k], v, d)


# singleton, with MPI started (in a child process) and checked
r = report({})
expect(r["distributed"], rank=0, world_size=1, local_rank=0, local_size=1, node_rank=0,
       master_addr=None, master_port=None, source="singleton")
assert r["mpi"].get("size") == 1 and r["mpi"].get("environment_check") == "ok", r["mpi"]

expect(dist({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
             "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}),
       rank=3, world_size=4, local_rank=1, local_size=2, node_rank=1, master_addr="10.0.0.1",
       master_port=29500, source="explicit")
expect(dist({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
             "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "SLURM_PROCID": "0", "SLURM_JOB_NODELIST": "node[01-02]"}),
       rank=1, world_size=4, local_rank=1, local_size=2, node_rank=None, master_addr="node01", source="openmpi")
expect(dist({"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "1",
             "SLURM_STEP_TASKS_PER_NODE": "2,1", "SLURM_STEP_NODELIST": "gpu[08-09]", "SLURM_STEP_NUM_NODES": "2"}),
       rank=2, world_size=3, local_rank=0, local_size=1, node_rank=1, master_addr="gpu08", master_port=None,
       source="slurm")
expect(dist({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}),
       rank=1, world_size=2, local_rank=1, local_size=2, node_rank=0, source="pmi")
expect(dist({"PMIX_RANK": "5", "PMIX_NAMESPACE": "x"}), rank=5, world_size=None, source="pmix")
expect(dist({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "2"}), rank=0, world_size=2, source="mvapich2")
expect(dist({"AZUREML_EXPERIMENT_ID": "e", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2",
             "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "AZ_BATCHAI_MPI_MASTER_NODE": "az0"}),
       master_addr="az0", master_port=54965, source="azureml")
expect(dist({"SM_TRAINING_ENV": "{}", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
             "MASTER_ADDR": "algo-1", "MASTER_PORT": "7777"}), master_addr="algo-1", master_port=7777, source="sagemaker")

# A malformed environment is reported (naming the variable), not a crash.
d = dist({"OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_SIZE": "4"})
assert d["source"] is None and "OMPI_COMM_WORLD_RANK=7" in d["error"], d

# A launcher environment that makes MPI_Init abort (Open MPI thinks srun started it without
# PMI) leaves the report intact, with the failure under mpi.error.
r = report({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0", "SLURM_NODELIST": "n1"})
assert r["distributed"]["source"] == "slurm" and "error" in r["mpi"], r["mpi"]

# Human form.
out = subprocess.run([exe, "--no_mpi"], env=BASE, capture_output=True, text=True, timeout=60)
assert out.returncode == 0 and "dstrain environment report" in out.stdout and "singleton" in out.stdout, out.stdout

# Real ranks under mpirun: the environment (openmpi) and MPI agree.
mpiexec = os.environ.get("DS_MPIEXEC", "mpirun")
out = subprocess.run([mpiexec, "--oversubscribe", "--bind-to", "none", "-np", "2", exe, "--json"], env=BASE,
                     capture_output=True, text=True, timeout=60)
assert out.returncode == 0, out.stderr
reports = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
assert sorted(x["distributed"]["rank"] for x in reports) == [0, 1], out.stdout
for x in reports:
    expect(x["distributed"], world_size=2, local_size=2, node_rank=0, source="openmpi")
    assert x["mpi"]["size"] == 2 and x["mpi"]["environment_check"] == "ok", x["mpi"]
print("test_ds_report: OK")
