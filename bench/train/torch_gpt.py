"""The PyTorch side of bench/train: the same GPT (GPT-2 architecture, tied head, pre-LN,
tanh GELU), same batch and AdamW, timed the same way (forward + backward + step).

Run with /usr/bin/python3 (torch 1.13). cpu_ms_per_step: rank 0's process CPU time per step
(all its threads), for the load-robust comparison in run.sh. One process:  torch_gpt.py --threads 2
DDP over gloo:  torchrun-free, we spawn ranks ourselves:  torch_gpt.py --ranks 2 --threads 1
Prints one JSON line (rank 0). Also measures torch's matmul GFLOP/s, to show which BLAS
torch really uses (reference BLAS gives ~3-5 GFLOP/s, OpenBLAS ~80+).
"""
import argparse, json, math, os, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.H = H

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C)
        # GPT-2 init, as ds::nn::Gpt: N(0, 0.02), residual projections / sqrt(2 L), zero biases.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            elif name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            else:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def matmul_gflops(n=1024, reps=5):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n ** 3 / sorted(ts)[len(ts) // 2] / 1e9


def run(rank, world, args, port):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    model = GPT(args.layers, args.heads, args.embd, args.seq, args.vocab)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    data = open(args.corpus, "rb").read()
    g = torch.Generator().manual_seed(rank)
    B, T = args.batch, args.seq
    buf = torch.tensor(list(data), dtype=torch.long)
    times, cpu = [], []
    first = last = None
    for s in range(args.warmup + args.steps):
        ix = torch.randint(len(buf) - T - 1, (B,), generator=g)
        x = torch.stack([buf[i:i + T] for i in ix])
        y = torch.stack([buf[i + 1:i + T + 1] for i in ix])
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model(x, y)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if s >= args.warmup:
            times.append(dt)
            cpu.append(dc)
        if first is None:
            first = loss.item()
        last = loss.item()
    tps = world * B * T * len(times) / sum(times)
    if rank == 0:
        gf = matmul_gflops()
        print(json.dumps({"impl": "pytorch", "ranks": world, "threads": args.threads,
                          "tokens_per_s": round(tps, 1), "step_ms": round(1e3 * sum(times) / len(times), 2),
                          "cpu_ms_per_step": round(1e3 * sum(cpu) / len(cpu), 2),
                          "matmul_gflops_1024": round(gf, 1), "torch": torch.__version__,
                          "blas": torch.__config__.show().count("BLAS"),
                          "loss_first": round(first, 4), "loss_last": round(last, 4)}), flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--corpus", default=os.path.join(os.path.dirname(__file__), "../../src/data/corpus/licenses.txt"))
    a = p.parse_args()
    if a.ranks == 1:
        run(0, 1, a, 0)
    else:
        import torch.multiprocessing as mp
        port = 29500 + os.getpid() % 1000
        mp.spawn(run, args=(a.ranks, a, port), nprocs=a.ranks, join=True)
