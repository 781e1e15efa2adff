#!/usr/bin/python3
"""ZeRO stage 3 memory for a TorchScript model given as a sequence of blocks: peak resident
memory per rank at stage 3 against stage 0, same model, data, ranks and steps.

The model (written here with the system's PyTorch): an nn.Sequential of --blocks blocks
(Linear(--width, --width), tanh), a Linear head to 16 outputs, the mse loss; its parameters
and AdamW state dominate the memory. `train --model torchscript:model.pt` runs --steps steps
at --ranks ranks, once with zero_optimization stage 0 and once with stage 3 (one group per
block: nothing persistent, no reuse distance, a prefetch and live limit of two blocks); the
figure of each run is the peak resident memory of its largest rank (VmHWM, train's summary).
--one_group: the same model with a multiply before the first block, which stage 3 gathers
whole around forward and backward (the contrast; give --max_ratio 0).

Checks: both runs' first losses agree within 1e-5 relative (the same model on the same
batch) and their last losses within 1e-4 relative. The headline is the ratio stage 3 / stage 0; --max_ratio (default 0.6)
fails the run above it with exit 3; a wrong result exits 1.

  bench/torch/zero3_memory.py [--build build] [--ranks 4] [--steps 3] [--blocks 10]
                              [--width 2048] [--batch 8] [--max_ratio 0.6]
"""
import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_bench import ROOT, checked_run, run_cli, run_env  # noqa: E402 (the same environment and runner)

OUTPUTS, SEED = 16, 1234


def make_inputs(a, work):
    """model.pt (the Sequential of blocks, forward(inputs, targets) -> loss) and data.h5."""
    import h5py
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Blocks(nn.Module):
        def __init__(self):
            super().__init__()
            layers = []
            for _ in range(a.blocks):
                layers += [nn.Linear(a.width, a.width), nn.Tanh()]
            self.body = nn.Sequential(*layers)
            self.head = nn.Linear(a.width, OUTPUTS)

        def forward(self, inputs, targets):
            return F.mse_loss(self.head(self.body(inputs)), targets)

    class OneGroup(Blocks):
        def forward(self, inputs, targets):  # work before the first block: not a sequence of blocks
            return F.mse_loss(self.head(self.body(inputs * 1.0)), targets)

    torch.manual_seed(SEED)
    torch.jit.script(OneGroup() if a.one_group else Blocks()).save(os.path.join(work, "model.pt"))
    n = a.steps * a.batch * a.ranks
    x = torch.randn(n, a.width)
    with h5py.File(os.path.join(work, "data.h5"), "w") as f:
        f["inputs"] = x.numpy()
        f["targets"] = torch.sin(x[:, :OUTPUTS]).numpy()


def config(a, stage):
    block = a.width * a.width + a.width
    zero = {"stage": stage}
    if stage == 3:
        zero.update(stage3_param_persistence_threshold=0, stage3_max_reuse_distance=0,
                    stage3_prefetch_bucket_size=block, stage3_max_live_parameters=2 * block,
                    reduce_bucket_size=2 * block)
    return {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": 1, "seed": SEED,
            "zero_optimization": zero,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999], "eps": 1e-8,
                                                      "weight_decay": 0.01}}}


def run_stage(a, work, stage):
    """One train run: the largest rank's peak resident MiB, model states MiB and the losses."""
    cfg, csv = os.path.join(work, f"ds{stage}.json"), os.path.join(work, f"loss{stage}.csv")
    with open(cfg, "w") as f:
        json.dump(config(a, stage), f)
    env = run_env(1)
    # glibc's default malloc: memory the run frees (libtorch's copy of the weights, once the
    # engine's storage replaces it) goes back, as it would for a user.
    del env["GLIBC_TUNABLES"]
    cmd = [os.environ.get("DS_MPIEXEC", "mpirun"), "--oversubscribe", "--bind-to", "none", "-np", str(a.ranks)]
    for k in ("OMP_NUM_THREADS", "OPENBLAS_CORETYPE", "LD_LIBRARY_PATH"):
        cmd += ["-x", k]
    cmd += [os.path.join(a.build, "apps/train/train"), "--config", cfg, "--model",
            "torchscript:" + os.path.join(work, "model.pt"), "--data", os.path.join(work, "data.h5"),
            "--val_fraction", "0", "--eval_iters", "0", "--steps", str(a.steps), "--loss_csv", csv]
    out = checked_run(cmd, env, f"train (stage {stage})")
    line = [l for l in out.splitlines() if l.startswith("[train] memory per rank:")]
    if not line or "peak resident " not in line[0]:
        raise RuntimeError("train printed no '[train] memory per rank: ... peak resident' line:\n" + out[-2000:])
    peak = float(line[0].split("peak resident ")[1].split(" MiB")[0])
    states = float(line[0].split("model states ")[1].split(" MiB")[0])
    losses = [float(l.split(",")[1]) for l in open(csv).read().splitlines()[1:]]
    print(f"stage {stage}: peak resident {peak:.1f} MiB (largest rank), model states {states:.1f} MiB, "
          f"loss {losses[0]:.6f} -> {losses[-1]:.6f}", flush=True)
    return {"peak_mib": peak, "states_mib": states, "losses": losses}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"), help="the build directory (apps/train/train)")
    for k, v in (("ranks", 4), ("steps", 3), ("blocks", 10), ("width", 2048), ("batch", 8)):
        p.add_argument("--" + k, type=int, default=v)
    p.add_argument("--max_ratio", type=float, default=0.6, help="fail (exit 3) above this ratio (0: no ceiling)")
    p.add_argument("--one_group", action="store_true",
                   help="the same model with a multiply before the first block: stage 3 gathers it whole")
    a = p.parse_args()
    if min(a.ranks, a.steps, a.blocks, a.batch) < 1 or a.width < OUTPUTS:
        p.error(f"need --ranks, --steps, --blocks, --batch >= 1 and --width >= {OUTPUTS}")
    with tempfile.TemporaryDirectory(prefix="ds_zero3_memory.") as work:
        make_inputs(a, work)
        s0, s3 = run_stage(a, work, 0), run_stage(a, work, 3)
    first = abs(s3["losses"][0] - s0["losses"][0]) / abs(s0["losses"][0])
    last = abs(s3["losses"][-1] - s0["losses"][-1]) / abs(s0["losses"][-1])
    ratio = s3["peak_mib"] / s0["peak_mib"]
    checks = [{"what": "the first losses agree", "ok": first <= 1e-5,
               "detail": f"first loss stage 3 {s3['losses'][0]:.7g} vs stage 0 {s0['losses'][0]:.7g} (rel {first:.1e})"},
              {"what": "the last losses agree", "ok": last <= 1e-4,
               "detail": f"last loss stage 3 {s3['losses'][-1]:.7g} vs stage 0 {s0['losses'][-1]:.7g} (rel {last:.1e})"}]
    failed = [c["detail"] for c in checks if not c["ok"]]
    above = a.max_ratio > 0 and not ratio <= a.max_ratio
    params = a.blocks * (a.width * a.width + a.width) + a.width * OUTPUTS + OUTPUTS
    rec = {"bench": "zero3_memory", "impl": "dstrain-torchscript", "ranks": a.ranks, "stage": 3, "checks": checks,
           "headline": f"peak resident per rank, ZeRO stage 3 / stage 0 ({a.ranks} ranks, "
                       f"{'the model as one group' if a.one_group else 'one group per block'})",
           "ratio": ratio, "max_ratio": a.max_ratio, "ok": not failed and not above,
           "model": f"Sequential of {a.blocks} x (Linear {a.width}, tanh), head {OUTPUTS}"
                    + (", one group" if a.one_group else ""), "parameters": params,
           "batch": a.batch, "steps": a.steps, "stage0": {k: s0[k] for k in ("peak_mib", "states_mib")},
           "stage3": {k: s3[k] for k in ("peak_mib", "states_mib")}, "cpus": os.cpu_count(),
           "load_average": " ".join(open("/proc/loadavg").read().split()[:3]),
           "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for m in failed:
        print(f"zero3_memory: error: result check failed: {m}", file=sys.stderr)
    if above:
        print(f"zero3_memory: error: ratio {ratio:.3f} is above --max_ratio {a.max_ratio:.3f}", file=sys.stderr)
    print(f"# zero3_memory: {len(checks)} result check(s) {'FAILED' if failed else 'passed'}; peak resident per rank "
          f"at {a.ranks} ranks, stage 3 / stage 0 = {s3['peak_mib']:.1f} / {s0['peak_mib']:.1f} MiB = {ratio:.3f} "
          f"(max_ratio {a.max_ratio:g}): "
          f"{'FAILED (wrong result)' if failed else 'FAILED (above --max_ratio)' if above else 'ok'}")
    print("JSON: " + json.dumps(rec), flush=True)
    return 1 if failed else 3 if above else 0


if __name__ == "__main__":
    run_cli(main, "zero3_memory")
