#!/usr/bin/python3
"""Optimizer trajectories from PyTorch 1.13 for dstrain's optimizer tests.

Runs torch.optim.{AdamW, Adam (L2 weight decay), SGD (momentum / dampening / nesterov /
weight decay), Adagrad} for STEPS steps on one fixed fp32 tensor with a fixed sequence of
gradients, and writes tests/optim/golden/torch_optim_trajectories.json:

  {"torch_version": ..., "steps": N, "numel": K, "cases": [
     {"name": ..., "config": {<ds_config optimizer params, our keys>},
      "init": [K floats], "grads": [[K floats] x N], "params": [[K floats] x N]}]}

params[k] is the parameter after step k+1. All values are fp32 numbers written exactly.
Run: /usr/bin/python3 scripts/make_torch_goldens.py   (from the repository root)
"""
import json
import os
import sys

import torch

STEPS = 20
NUMEL = 37


def trajectory(make_opt, init, grads):
    p = torch.nn.Parameter(init.clone())
    opt = make_opt([p])
    out = []
    for g in grads:
        opt.zero_grad()
        p.grad = g.clone()
        opt.step()
        out.append(p.detach().clone())
    return out


def main():
    torch.manual_seed(1234)
    init = torch.randn(NUMEL, dtype=torch.float32)
    # Gradients of varying magnitude, some exact zeros, one sign flip pattern.
    grads = []
    for k in range(STEPS):
        g = torch.randn(NUMEL, dtype=torch.float32) * (0.5 + 0.1 * k)
        g[k % NUMEL] = 0.0
        grads.append(g)

    O = torch.optim
    cases = [
        ("adamw", {"type": "adamw", "lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.1},
         lambda ps: O.AdamW(ps, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
        ("adamw_betas", {"type": "adamw", "lr": 3e-3, "betas": [0.8, 0.95], "eps": 1e-6, "weight_decay": 0.0},
         lambda ps: O.AdamW(ps, lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.0)),
        ("adam_l2", {"type": "adam", "adam_w_mode": False, "lr": 1e-2, "betas": [0.9, 0.999], "eps": 1e-8,
                     "weight_decay": 0.1},
         lambda ps: O.Adam(ps, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
        ("sgd_nesterov", {"type": "sgd", "lr": 5e-2, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01},
         lambda ps: O.SGD(ps, lr=5e-2, momentum=0.9, nesterov=True, weight_decay=0.01)),
        ("sgd_dampening", {"type": "sgd", "lr": 5e-2, "momentum": 0.9, "dampening": 0.1},
         lambda ps: O.SGD(ps, lr=5e-2, momentum=0.9, dampening=0.1)),
        ("sgd_plain", {"type": "sgd", "lr": 0.1},
         lambda ps: O.SGD(ps, lr=0.1)),
        ("adagrad", {"type": "adagrad", "lr": 5e-2, "lr_decay": 0.01, "weight_decay": 0.01,
                     "initial_accumulator_value": 0.1, "eps": 1e-10},
         lambda ps: O.Adagrad(ps, lr=5e-2, lr_decay=0.01, weight_decay=0.01, initial_accumulator_value=0.1,
                              eps=1e-10)),
    ]
    doc = {"torch_version": torch.__version__, "steps": STEPS, "numel": NUMEL,
           "init": init.tolist(), "grads": [g.tolist() for g in grads], "cases": []}
    for name, cfg, make in cases:
        traj = trajectory(make, init, grads)
        doc["cases"].append({"name": name, "config": cfg, "params": [t.tolist() for t in traj]})

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(root, "tests", "optim", "golden", "torch_optim_trajectories.json")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"wrote {path}: {len(cases)} cases x {STEPS} steps x {NUMEL} params (torch {torch.__version__})")


if __name__ == "__main__":
    sys.exit(main())
