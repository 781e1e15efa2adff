#!/usr/bin/python3
"""TorchScript training throughput: dstrain against PyTorch itself on the same model.

One TorchScript MLP regression (written here with the system's PyTorch), one HDF5 data set and
one AdamW setting, trained for --steps steps by `train --model torchscript:...` and by PyTorch
(torch.jit.load of the same file; DDP over gloo for more than one rank), with the same
threads, BLAS and sample order (the Python side replays dstrain's DistributedSampler). Each
layout (1x2: 1 rank x 2 threads, 2x1: 2 ranks x 1 thread) runs --rounds rounds, dstrain and
PyTorch back to back in each; the headline is the median over rounds of dstrain samples/s over
PyTorch samples/s (both timed from the end of the first step to the end of the last).

Checks: both sides' losses fall, and dstrain's first loss equals PyTorch's (same weights, same
first batch) within 1e-5 relative. One JSON: record per layout; --min_ratio (default 0: no
floor) fails a layout below it with exit 3; a wrong result exits 1, a bad flag 2. The
targets, on an idle machine: --layouts 1x2 --min_ratio 1.0 and --layouts 2x1 --min_ratio 1.1.

  bench/torch/torch_bench.py [--build build] [--layouts 1x2,2x1] [--rounds 3] [--steps 30]
                             [--batch 64] [--features 256] [--hidden 1024] [--layers 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SEED, OUTPUTS, LR = 1234, 16, 1e-3
M64 = (1 << 64) - 1


def sampler_order(n, world, rank, seed=SEED, epoch=0):
    """dstrain's DistributedSampler (shuffle on, epoch 0, n a multiple of world): rank's indices."""
    perm = list(range(n))
    s = (seed * 0xD1B54A32D192ED03 + epoch * 0x9E3779B97F4A7C15 + 0x1234567) & M64
    for i in range(n, 1, -1):  # Fisher-Yates over splitmix64, as src/data/src/sampler.cpp
        s = (s + 0x9E3779B97F4A7C15) & M64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        j = (z ^ (z >> 31)) % i
        perm[i - 1], perm[j] = perm[j], perm[i - 1]
    return perm[rank::world]


def make_inputs(a, work):
    """The scripted MLP (model.pt) and data.h5 (inputs [N, features], targets [N, 16])."""
    import h5py
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            widths = [a.features] + [a.hidden] * a.layers
            self.body = nn.ModuleList([nn.Linear(i, o) for i, o in zip(widths, widths[1:])])
            self.head = nn.Linear(a.hidden, OUTPUTS)

        def forward(self, inputs, targets):
            h = inputs
            for layer in self.body:
                h = torch.tanh(layer(h))
            return F.mse_loss(self.head(h).float(), targets)

    torch.manual_seed(SEED)
    torch.jit.script(Mlp()).save(os.path.join(work, "model.pt"))
    n = a.steps * a.batch * 2  # one epoch covers every layout's steps
    x = torch.randn(n, a.features)
    y = torch.sin(x[:, :OUTPUTS] + x[:, OUTPUTS:2 * OUTPUTS]) + 0.05 * torch.randn(n, OUTPUTS)
    with h5py.File(os.path.join(work, "data.h5"), "w") as f:
        f["inputs"] = x.numpy()
        f["targets"] = y.numpy()
    with open(os.path.join(work, "ds.json"), "w") as f:
        json.dump({"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1, "seed": SEED,
                   "optimizer": {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.999], "eps": 1e-8,
                                                             "weight_decay": 0.01}}}, f)


def torch_rank(rank, world, a, work, port, out):
    """One PyTorch rank: the same scripted module, sample order and AdamW as dstrain."""
    import h5py
    import torch
    torch.set_num_threads(a.threads)
    if world > 1:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    model = torch.jit.load(os.path.join(work, "model.pt"))
    step_fn = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    with h5py.File(os.path.join(work, "data.h5"), "r") as f:
        x, y = torch.from_numpy(f["inputs"][:]), torch.from_numpy(f["targets"][:])
    order = torch.tensor(sampler_order(len(x), world, rank))
    losses, ends = [], []
    for s in range(a.steps):
        idx = order[s * a.batch:(s + 1) * a.batch]
        loss = step_fn(x[idx], y[idx])
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        ends.append(time.perf_counter())
    if world > 1:  # after the timed steps: every rank's losses, for the mean dstrain logs
        every = [None] * world
        torch.distributed.all_gather_object(every, losses)
        losses = [statistics.fmean(v) for v in zip(*every)]
        torch.distributed.destroy_process_group()
    if rank == 0:
        rate = (a.steps - 1) * a.batch * world / (ends[-1] - ends[0])
        with open(out, "w") as f:
            json.dump({"samples_per_s": rate, "losses": losses}, f)


def torch_worker(a):
    out = os.path.join(a.work, "torch.json")
    if a.ranks == 1:
        torch_rank(0, 1, a, a.work, 0, out)
    else:
        import torch.multiprocessing as mp
        mp.spawn(torch_rank, args=(a.ranks, a, a.work, 29500 + os.getpid() % 1000, out), nprocs=a.ranks, join=True)


def run_env(threads):
    """Both sides: OpenBLAS (Debian's torch links the reference BLAS otherwise), its best core
    here, the malloc tunables of bench/train/run.sh, the layout's threads."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               GLIBC_TUNABLES="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184")
    avx512 = " avx512f " in open("/proc/cpuinfo").read().replace("\n", " ")
    env.setdefault("OPENBLAS_CORETYPE", "SkylakeX" if avx512 else "Haswell")
    blas = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
    env["LD_LIBRARY_PATH"] = blas + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return env


def checked_run(cmd, env, what):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout[-3000:] + p.stderr[-3000:])
        raise RuntimeError(f"{what} exited {p.returncode}: {' '.join(cmd)}")
    return p.stdout


def run_dstrain(a, work, ranks, threads):
    """train --model torchscript:model.pt: samples/s from its summary line, losses from --loss_csv."""
    csv = os.path.join(work, "dstrain_loss.csv")
    env = run_env(threads)
    cmd = [os.environ.get("DS_MPIEXEC", "mpirun"), "--oversubscribe", "--bind-to", "none", "-np", str(ranks)]
    for k in ("OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "GLIBC_TUNABLES", "LD_LIBRARY_PATH"):
        cmd += ["-x", k]
    cmd += [os.path.join(a.build, "apps/train/train"), "--config", os.path.join(work, "ds.json"),
            "--model", "torchscript:" + os.path.join(work, "model.pt"), "--data", os.path.join(work, "data.h5"),
            "--val_fraction", "0", "--eval_iters", "0", "--steps", str(a.steps), "--loss_csv", csv]
    out = checked_run(cmd, env, "train")
    done = [l for l in out.splitlines() if l.startswith("[train] done:")]
    if not done or " samples/s" not in done[0]:
        raise RuntimeError("train printed no '[train] done: ... samples/s' line:\n" + out[-2000:])
    rate = float(done[0].split(" samples/s")[0].rsplit(" ", 1)[1])
    losses = [float(l.split(",")[1]) for l in open(csv).read().splitlines()[1:]]
    return {"samples_per_s": rate, "losses": losses}


def run_pytorch(a, work, ranks, threads):
    shape = [f"--{k}={getattr(a, k)}" for k in ("steps", "batch", "features", "hidden", "layers")]
    cmd = [sys.executable, os.path.abspath(__file__), "--torch_worker", "--work", work, "--ranks", str(ranks),
           "--threads", str(threads)] + shape
    checked_run(cmd, run_env(threads), "the PyTorch reference")
    return json.load(open(os.path.join(work, "torch.json")))


def falls(losses):
    """The mean of the last three steps is below 0.9 x the mean of the first three."""
    return statistics.fmean(losses[-3:]) < 0.9 * statistics.fmean(losses[:3])


def layout_record(a, work, layout):
    ranks, threads = (int(v) for v in layout.split("x"))
    rounds = []
    for r in range(a.rounds):  # back to back, so a load change hits both sides of a round
        ds, pt = run_dstrain(a, work, ranks, threads), run_pytorch(a, work, ranks, threads)
        rounds.append((ds, pt))
        print(f"{layout} round {r + 1}: dstrain {ds['samples_per_s']:.0f} samples/s, PyTorch "
              f"{pt['samples_per_s']:.0f}, ratio {ds['samples_per_s'] / pt['samples_per_s']:.3f}; "
              f"loss {ds['losses'][0]:.6f} -> {ds['losses'][-1]:.6f} (PyTorch {pt['losses'][0]:.6f} -> "
              f"{pt['losses'][-1]:.6f})", flush=True)
    ds, pt = rounds[0]
    rel = abs(ds["losses"][0] - pt["losses"][0]) / abs(pt["losses"][0])
    checks = [{"what": "dstrain's loss falls", "ok": all(falls(d["losses"]) for d, _ in rounds),
               "detail": f"dstrain loss {ds['losses'][0]:.5f} -> {ds['losses'][-1]:.5f}"},
              {"what": "PyTorch's loss falls", "ok": all(falls(p["losses"]) for _, p in rounds),
               "detail": f"PyTorch loss {pt['losses'][0]:.5f} -> {pt['losses'][-1]:.5f}"},
              {"what": "first loss equals PyTorch's", "ok": rel <= 1e-5,
               "detail": f"first loss {ds['losses'][0]:.7g} vs PyTorch {pt['losses'][0]:.7g} (rel {rel:.1e})"}]
    ratio = statistics.median(d["samples_per_s"] / p["samples_per_s"] for d, p in rounds)
    return {"bench": "torch_bench", "impl": "dstrain-torchscript", "ranks": ranks, "threads": threads,
            "checks": checks, "headline": f"dstrain samples/s / PyTorch{' DDP gloo' if ranks > 1 else ''} "
            f"samples/s ({ranks} x {threads}), median of {a.rounds} rounds", "ratio": ratio,
            "dstrain_samples_per_s": [round(d["samples_per_s"], 1) for d, _ in rounds],
            "pytorch_samples_per_s": [round(p["samples_per_s"], 1) for _, p in rounds],
            "model": f"MLP {a.features}-{'-'.join([str(a.hidden)] * a.layers)}-{OUTPUTS}", "batch": a.batch,
            "steps": a.steps}


def finish(rec, min_ratio):
    """bench/common/bench_report.h's verdict: exit 1 on a failed check, 3 below --min_ratio."""
    failed = [c["detail"] for c in rec["checks"] if not c["ok"]]
    below = min_ratio > 0 and not rec["ratio"] >= min_ratio
    code = 1 if failed else 3 if below else 0
    rec.update(ok=code == 0, min_ratio=min_ratio, below_min_ratio=below, cpus=os.cpu_count(),
               load_average=" ".join(open("/proc/loadavg").read().split()[:3]),
               utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    for f in failed:
        print(f"torch_bench: error: result check failed: {f}", file=sys.stderr)
    if below:
        print(f"torch_bench: error: {rec['headline']} = {rec['ratio']:.3f} is below --min_ratio {min_ratio:.3f}",
              file=sys.stderr)
    verdict = "ok" if code == 0 else "FAILED (wrong result)" if code == 1 else "FAILED (below --min_ratio)"
    print(f"# torch_bench: {len(rec['checks'])} result check(s) {'FAILED' if failed else 'passed'}; "
          f"{rec['headline']} = {rec['ratio']:.3f} (min_ratio {min_ratio:g}): {verdict}")
    return code


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory (apps/train/train)")
    p.add_argument("--layouts", default="1x2,2x1", help="ranks x threads, comma-separated")
    p.add_argument("--min_ratio", type=float, default=0.0, help="fail (exit 3) below this ratio (0: no floor)")
    p.add_argument("--torch_worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--ranks", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    for k, v in (("rounds", 3), ("steps", 30), ("batch", 64), ("features", 256), ("hidden", 1024), ("layers", 3)):
        p.add_argument("--" + k, type=int, default=v)
    a = p.parse_args()
    if min(a.rounds, a.batch, a.hidden, a.layers) < 1 or a.steps < 6 or a.features < 2 * OUTPUTS:
        p.error(f"need --rounds, --batch, --hidden, --layers >= 1, --steps >= 6, --features >= {2 * OUTPUTS}")
    if a.min_ratio < 0:
        p.error(f"--min_ratio: expected a number >= 0, got {a.min_ratio}")
    for layout in a.layouts.split(","):
        r, _, t = layout.partition("x")
        if not (r.isdigit() and t.isdigit() and int(r) in (1, 2) and int(t) >= 1):
            p.error(f"--layouts: expected RANKSxTHREADS with 1 or 2 ranks, got '{layout}'")
    return a


def main():
    a = parse_args()
    if a.torch_worker:
        return torch_worker(a)
    print(f"torch_bench: load average at start {' '.join(open('/proc/loadavg').read().split()[:3])} "
          f"on {os.cpu_count()} CPUs", flush=True)
    codes = []
    with tempfile.TemporaryDirectory(prefix="ds_torch_bench.") as work:
        make_inputs(a, work)
        for layout in a.layouts.split(","):
            rec = layout_record(a, work, layout)
            codes.append(finish(rec, a.min_ratio))
            print("JSON: " + json.dumps(rec), flush=True)
    return 1 if 1 in codes else 3 if 3 in codes else 0


def run_cli(main_fn, name):
    """Exits with main_fn()'s code; a RuntimeError becomes one 'NAME: error: ...' line, exit 1."""
    try:
        sys.exit(main_fn())
    except RuntimeError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    run_cli(main, "torch_bench")
