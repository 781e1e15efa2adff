#!/usr/bin/python3
"""torch.save (+ fsync) / torch.load of the same tensors as bench_checkpoint: N bf16 params in
12 tensors, fp32 master, exp_avg, exp_avg_sq. Prints '<what> <bytes> <seconds> <GB/s>'."""
import os
import statistics
import sys
import time

import torch

path, n, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
master = (torch.arange(n, dtype=torch.float32) % 1000) * 1e-3 - 0.5
sd = {"module": {f"layer{t}.weight": c for t, c in enumerate(master.to(torch.bfloat16).chunk(12))},
      "optimizer": {"fp32_master": master, "exp_avg": master * 0.1, "exp_avg_sq": master * master}}
nbytes = n * 14
save_t, load_t = [], []
for _ in range(repeats):
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
    save_t.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    loaded = torch.load(path)
    load_t.append(time.perf_counter() - t0)
    del loaded
os.remove(path)
for what, ts in (("torch_save", save_t), ("torch_load", load_t)):
    t = statistics.median(ts)
    print(f"{what} {nbytes} {t:.3f} {nbytes / t / 1e9:.3f}")
