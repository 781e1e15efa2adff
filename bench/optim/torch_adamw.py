#!/usr/bin/python3
"""torch.optim.AdamW(foreach=True) step time, the baseline for bench/optim (not a test).

Usage: torch_adamw.py N THREADS REPEATS  -> prints one line: "torch_adamw n=N threads=T median_s=S"
Best setup for torch here (bench/results/2026-11-29-quiet.md, "Optimizer step"): run under
GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184 so its per-step
temporaries reuse heap pages instead of faulting fresh ones, and torch.set_num_threads(T).
"""
import statistics
import sys
import time

import torch


def main():
    n, threads, repeats = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    p = torch.nn.Parameter(torch.randn(n))
    p.grad = torch.randn(n)
    opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=0.01, foreach=True)
    opt.step()  # allocates the state; warm-up
    opt.step()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    print(f"torch_adamw n={n} threads={threads} median_s={statistics.median(times):.6f}")


if __name__ == "__main__":
    main()
