#!/usr/bin/env python3
"""The CPU Llama against a tiny Llama written in plain PyTorch (Hugging Face LlamaForCausalLM's
semantics: RMSNorm in fp32, rotate_half rotary embedding, repeat_kv grouped-query attention,
SwiGLU MLP, no biases). llama_torch_dump writes the weights, a batch and our logits, loss and
gradients; this script loads the same weights by name, and the logits must agree within 1e-4
relative (max |ours - torch| / max |torch|), the loss within 1e-5 relative, and every
gradient within 1e-3 relative to its largest element.
Usage: llama_vs_torch.py LLAMA_TORCH_DUMP. Exit 77 (skipped) without torch."""
import array
import os
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError:
    print("SKIP: torch is not importable")
    sys.exit(77)

DUMP = sys.argv[1]


def rmsnorm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def llama_logits(P, cfg, tokens):
    n_layer, n_head, n_kv, C, I, block, V, tie, B, T, theta, eps = cfg
    hd = C // n_head
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    x = P["model.embed_tokens.weight"][tokens]  # [B, T, C]
    mask = torch.full((T, T), float("-inf")).triu(1)
    for l in range(n_layer):
        p = f"model.layers.{l}."
        h = rmsnorm(x, P[p + "input_layernorm.weight"], eps)
        q = (h @ P[p + "self_attn.q_proj.weight"].T).view(B, T, n_head, hd).transpose(1, 2)
        k = (h @ P[p + "self_attn.k_proj.weight"].T).view(B, T, n_kv, hd).transpose(1, 2)
        v = (h @ P[p + "self_attn.v_proj.weight"].T).view(B, T, n_kv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(n_head // n_kv, dim=1)  # HF repeat_kv
        v = v.repeat_interleave(n_head // n_kv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / hd ** 0.5 + mask, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + y @ P[p + "self_attn.o_proj.weight"].T
        h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], eps)
        g = h @ P[p + "mlp.gate_proj.weight"].T
        u = h @ P[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(g) * u) @ P[p + "mlp.down_proj.weight"].T
    x = rmsnorm(x, P["model.norm.weight"], eps)
    head = P["model.embed_tokens.weight"] if tie else P["lm_head.weight"]
    return x @ head.T


def check(shape_args):
    with tempfile.TemporaryDirectory() as d:
        prefix = os.path.join(d, "llama")
        subprocess.run([DUMP, prefix] + [str(a) for a in shape_args], check=True)
        lines = open(prefix + ".txt").read().split("\n")
        f = lines[0].split()
        cfg = [int(v) for v in f[:10]] + [float(f[10]), float(f[11])]
        names = [(ln.split()[0], int(ln.split()[1])) for ln in lines[1:] if ln.strip()]
        raw = open(prefix + ".bin", "rb").read()
    B, T, V = cfg[8], cfg[9], cfg[6]
    pos = 0

    def take(n, code="f"):
        nonlocal pos
        a = array.array(code)
        a.frombytes(raw[pos:pos + 4 * n])
        pos += 4 * n
        return a

    P = {}
    for name, n in names:
        P[name] = torch.tensor(take(n), dtype=torch.float32)
    inputs = torch.tensor(take(B * T, "i"), dtype=torch.long).view(B, T)
    targets = torch.tensor(take(B * T, "i"), dtype=torch.long).view(B, T)
    ours_logits = torch.tensor(take(B * T * V)).view(B, T, V)
    ours_loss = take(1)[0]
    ours_grads = {name: torch.tensor(take(n)) for name, n in names}
    assert pos == len(raw), f"{len(raw) - pos} bytes left over"

    # Shapes: HF's [out, in] per the layout (the names say which).
    C, I, hd = cfg[3], cfg[4], cfg[3] // cfg[1]
    shapes = {"embed_tokens": (V, C), "q_proj": (C, C), "k_proj": (cfg[2] * hd, C), "v_proj": (cfg[2] * hd, C),
              "o_proj": (C, C), "gate_proj": (I, C), "up_proj": (I, C), "down_proj": (C, I), "lm_head": (V, C)}
    for name in P:
        for key, s in shapes.items():
            if key in name:
                P[name] = P[name].view(*s)
        P[name].requires_grad_(True)
    logits = llama_logits(P, cfg, inputs)
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1))
    loss.backward()
    label = "n_layer={} n_head={} n_kv_head={} n_embd={} intermediate={} tie={}".format(*cfg[:5], cfg[7])
    worst = 0.0
    rel = ((ours_logits - logits.detach()).abs().max() / logits.detach().abs().max()).item()
    print(f"{label}: logits rel err {rel:.2e}, loss ours {ours_loss:.6f} torch {loss.item():.6f}")
    ok = rel <= 1e-4
    ok &= abs(ours_loss - loss.item()) <= 1e-5 * abs(loss.item())
    for name, _ in names:
        g = P[name].grad.reshape(-1)
        e = ((ours_grads[name] - g).abs().max() / g.abs().max().clamp_min(1e-30)).item()
        worst = max(worst, e)
        if e > 1e-3:
            print(f"  gradient of {name}: rel err {e:.2e}")
            ok = False
    print(f"  worst gradient rel err {worst:.2e}")
    return ok


cases = [
    # n_layer n_head n_kv_head n_embd intermediate block vocab tie B T
    (2, 4, 2, 32, 0, 16, 37, 0, 2, 12),   # grouped-query, untied, default intermediate (86)
    (2, 4, 4, 32, 48, 16, 37, 1, 2, 16),  # multi-head, tied
    (1, 4, 1, 64, 96, 8, 50, 0, 1, 8),    # one kv head
]
results = [check(c) for c in cases]
if not all(results):
    print("FAIL")
    sys.exit(1)
print("PASS")
