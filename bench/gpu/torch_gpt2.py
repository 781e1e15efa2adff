"""PyTorch reference for bench_gpt_cuda: the same GPT (pre-LN, tied head, tanh GELU, same
shape) trained with the same batch and AdamW in bf16 autocast on the same GPU, in the same
run. PyTorch gets its best eager setup: fused AdamW, scaled_dot_product_attention (flash
attention), TF32 allowed; --compile adds torch.compile. Prints one line:
  torch_gpt2 <dtype> step_ms <median> tokens/s <rate>
Usage: python3 torch_gpt2.py [--layers 12 --heads 12 --embd 768 --block 1024 --vocab 50304
                              --batch 16 --steps 30 --warmup 5 --compile]
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, nh, c, block, vocab):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(block, c)
        self.h = nn.ModuleList(Block(c, nh) for _ in range(L))
        self.ln_f = nn.LayerNorm(c)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * L) if n.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.h:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    for k, v in dict(layers=12, heads=12, embd=768, block=1024, vocab=50304, batch=16, steps=30, warmup=5).items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--compile", action="store_true")
    a = ap.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    model = GPT(a.layers, a.heads, a.embd, a.block, a.vocab).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_fn = torch.compile(model) if a.compile else model
    data = [torch.randint(0, a.vocab, (a.batch, a.block + 1), device=dev) for _ in range(4)]
    times = []
    for s in range(a.warmup + a.steps):
        d = data[s % len(data)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_fn(d[:, :-1], d[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss.item()
        torch.cuda.synchronize()
        if s >= a.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    ms = sorted(times)[len(times) // 2]
    tag = "bf16+compile" if a.compile else "bf16"
    print(f"torch_gpt2 {tag} step_ms {ms:.2f} tokens/s {a.batch * a.block / (ms * 1e-3):.0f} (torch {torch.__version__})")


if __name__ == "__main__":
    main()
