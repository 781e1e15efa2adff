"""PyTorch reference GPT for the training benchmarks: the same model as ds::nn::Gpt (GPT-2
architecture: pre-LN, tied head, tanh GELU, GPT-2 init), the same batch and AdamW, timed the
same way (forward + backward + step). One script for both sides of bench/:

  CPU (bench/train/run.sh; /usr/bin/python3, torch 1.13): the bench shape (4 layers, 4 heads,
    256 wide, context 128, vocab 256, batch 8), fp32, the embedded corpus, explicit masked
    attention, AdamW lr 1e-3, no clipping. One process:  torch_gpt.py --threads 2
    DDP over gloo (we spawn the ranks ourselves):  torch_gpt.py --ranks 2 --threads 1
  GPU (bench/gpu, bench_gpt_cuda's reference; torch 2.x with CUDA): --device cuda, GPT-2 124M
    (12 layers, 12 heads, 768 wide, context 1024, vocab 50304, batch 16), bf16 autocast,
    random tokens on the device, PyTorch's best eager setup: fused AdamW lr 6e-4,
    scaled_dot_product_attention (flash), TF32 allowed, clipping 1.0; --compile adds
    torch.compile. Also prints the line "torch_gpt2 <dtype> step_ms <median> tokens/s <rate>".

Every default depends on --device; any flag overrides it. Prints one record line (rank 0):
  JSON: {"bench": "torch_gpt", "impl": "pytorch", "device": ..., "tokens_per_s": ..., ...}
On the CPU it also measures torch's matmul GFLOP/s, to show which BLAS torch really uses
(the reference BLAS gives ~3-5 GFLOP/s, OpenBLAS ~80+). cpu_ms_per_step: rank 0's process
CPU time per step (all its threads), for the load-robust comparison in bench/train/run.sh.
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# Per-device defaults: the CPU bench shape and setup, and GPT-2 124M on a GPU.
DEFAULTS = {
    "cpu": dict(layers=4, heads=4, embd=256, seq=128, vocab=256, batch=8, steps=20, warmup=3, dtype="fp32",
                lr=1e-3, clip=0.0, attention="explicit", data="corpus", fused=False),
    "cuda": dict(layers=12, heads=12, embd=768, seq=1024, vocab=50304, batch=16, steps=30, warmup=5, dtype="bf16",
                 lr=6e-4, clip=1.0, attention="sdpa", data="random", fused=True),
}


class Block(nn.Module):
    def __init__(self, C, H, attention):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        self.H = H
        self.attention = attention

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
        k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
        v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13 has no scaled_dot_product_attention
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L, H, C, T, V, attention="explicit"):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H, attention) for _ in range(L)])
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
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def matmul_gflops(n=1024, reps=5):
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return 2 * n ** 3 / sorted(ts)[len(ts) // 2] / 1e9


def batches(args, rank, dev):
    """Yields (inputs, targets) forever: random windows of the corpus (CPU), or a few random
    token batches cycled (GPU: the data costs nothing there)."""
    B, T = args.batch, args.seq
    if args.data == "corpus":
        data = open(args.corpus, "rb").read()
        g = torch.Generator().manual_seed(rank)
        buf = torch.tensor(list(data), dtype=torch.long)
        while True:
            ix = torch.randint(len(buf) - T - 1, (B,), generator=g)
            yield (torch.stack([buf[i:i + T] for i in ix]).to(dev), torch.stack([buf[i + 1:i + T + 1] for i in ix]).to(dev))
    else:
        data = [torch.randint(0, args.vocab, (B, T + 1), device=dev) for _ in range(4)]
        s = 0
        while True:
            d = data[s % len(data)]
            s += 1
            yield d[:, :-1], d[:, 1:]


def run(rank, world, args, port):
    cuda = args.device == "cuda"
    dev = args.device
    if not cuda:
        torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if world > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    model = GPT(args.layers, args.heads, args.embd, args.seq, args.vocab, args.attention).to(dev)
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
    extra = {"fused": True} if args.fused else {}
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, **extra)
    step_fn = torch.compile(model) if args.compile else model
    autocast = args.dtype == "bf16"
    data = batches(args, rank, dev)
    times, cpu = [], []
    first = last = None
    for s in range(args.warmup + args.steps):
        x, y = next(data)
        if cuda:
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        if autocast:
            with torch.autocast(dev, dtype=torch.bfloat16):
                loss = step_fn(x, y)
        else:
            loss = step_fn(x, y)
        if not args.fused:  # the CPU setup as measured before: grads zeroed in place before backward
            opt.zero_grad(set_to_none=False)
        loss.backward()
        if args.clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        opt.step()
        if args.fused:
            opt.zero_grad(set_to_none=True)
        if cuda:
            loss.item()
            torch.cuda.synchronize()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        if s >= args.warmup:
            times.append(dt)
            cpu.append(dc)
        if first is None:
            first = loss.item()
        last = loss.item()
    tps = world * args.batch * args.seq * len(times) / sum(times)
    med_ms = 1e3 * sorted(times)[len(times) // 2]
    if rank == 0:
        rec = {"bench": "torch_gpt", "impl": "pytorch", "device": dev, "dtype": args.dtype, "ranks": world,
               "threads": args.threads, "compile": args.compile, "tokens_per_s": round(tps, 1),
               "step_ms": round(1e3 * sum(times) / len(times), 2), "step_ms_median": round(med_ms, 2),
               "cpu_ms_per_step": round(1e3 * sum(cpu) / len(cpu), 2), "torch": torch.__version__,
               "loss_first": round(first, 4), "loss_last": round(last, 4)}
        if cuda:
            tag = args.dtype + ("+compile" if args.compile else "")
            print(f"torch_gpt2 {tag} step_ms {med_ms:.2f} tokens/s {args.batch * args.seq / (med_ms * 1e-3):.0f} "
                  f"(torch {torch.__version__})", flush=True)
        else:
            rec["matmul_gflops_1024"] = round(matmul_gflops(), 1)
            rec["blas"] = torch.__config__.show().count("BLAS")
        print("JSON: " + json.dumps(rec), flush=True)
    if world > 1:
        torch.distributed.destroy_process_group()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], help="bf16: autocast (cpu default fp32, cuda bf16)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (torch 2.x)")
    p.add_argument("--attention", choices=["explicit", "sdpa"], help="masked softmax or scaled_dot_product_attention")
    p.add_argument("--data", choices=["corpus", "random"])
    p.add_argument("--fused", action="store_true", default=None, help="fused AdamW, grads set to None after the step")
    p.add_argument("--lr", type=float)
    p.add_argument("--clip", type=float, help="gradient clipping norm (0: none)")
    p.add_argument("--ranks", type=int, default=1, help="CPU: DDP over gloo with this many processes")
    p.add_argument("--threads", type=int, default=2)
    for k in ("steps", "warmup", "layers", "heads", "embd", "vocab", "batch"):
        p.add_argument("--" + k, type=int)
    p.add_argument("--seq", "--block", dest="seq", type=int, help="context length")
    p.add_argument("--corpus", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                    "../../src/data/corpus/licenses.txt"))
    a = p.parse_args(argv)
    for k, v in DEFAULTS[a.device].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.ranks > 1 and a.device != "cpu":
        p.error("--ranks > 1 runs DDP over gloo on the CPU only")
    return a


if __name__ == "__main__":
    a = parse_args()
    if a.ranks == 1:
        run(0, 1, a, 0)
    else:
        import torch.multiprocessing as mp
        port = 29500 + os.getpid() % 1000
        mp.spawn(run, args=(a.ranks, a, port), nprocs=a.ranks, join=True)
