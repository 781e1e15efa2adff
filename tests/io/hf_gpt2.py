#!/usr/bin/python3
"""A Hugging Face style GPT-2 in plain torch (no transformers, no safetensors package): its
weights carry transformers' names and Conv1D layout ([in, out]) and travel as safetensors
files written and parsed by hand (struct + json).

usage:
  hf_gpt2.py make OUT.safetensors LOGITS.txt SHAPE TOKENS   random weights (seeded) + logits
  hf_gpt2.py logits IN.safetensors LOGITS.txt SHAPE TOKENS  logits of a file's weights
  hf_gpt2.py compare A.txt B.txt TOL                        max |a - b| <= TOL * max |b|
  hf_gpt2.py same A.safetensors B.safetensors               the same tensors, bit for bit
SHAPE: n_layer,n_head,n_embd,block_size,vocab; TOKENS: comma-separated ids. The logits file
has one line per position (the logits after each prefix of TOKENS).
"""
import json
import math
import struct
import sys

import numpy as np
import torch


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        b = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, h in header.items():
        assert h["dtype"] == "F32", (name, h["dtype"])
        b, e = h["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[b:e], dtype="<f4").reshape(h["shape"]).copy())
    return out, meta


def strip(sd):
    return {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward(sd, tokens, n_layer, n_head):
    """Logits [T, V] of GPT2LMHeadModel (Conv1D: y = x @ W + b), in float64."""
    sd = {k: v.double() for k, v in strip(sd).items()}
    T = len(tokens)
    idx = torch.tensor(tokens)
    x = sd["wte.weight"][idx] + sd["wpe.weight"][:T]
    C = x.shape[1]
    hd = C // n_head
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    ln = lambda v, p: torch.nn.functional.layer_norm(v, (C,), sd[p + ".weight"], sd[p + ".bias"], 1e-5)
    for l in range(n_layer):
        p = f"h.{l}."
        h = ln(x, p + "ln_1")
        qkv = h @ sd[p + "attn.c_attn.weight"] + sd[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(T, n_head, hd).transpose(0, 1) for t in qkv.split(C, dim=1))
        att = (q @ k.transpose(1, 2)) / math.sqrt(hd)
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ v).transpose(0, 1).reshape(T, C)
        x = x + y @ sd[p + "attn.c_proj.weight"] + sd[p + "attn.c_proj.bias"]
        h = ln(x, p + "ln_2")
        h = gelu_new(h @ sd[p + "mlp.c_fc.weight"] + sd[p + "mlp.c_fc.bias"])
        x = x + h @ sd[p + "mlp.c_proj.weight"] + sd[p + "mlp.c_proj.bias"]
    x = ln(x, "ln_f")
    return x @ sd["wte.weight"].t()


def make(n_layer, n_head, C, T, V):
    """Random weights as transformers names them in GPT2LMHeadModel.state_dict(), with the
    attention buffers and the tied lm_head; large enough to make every tensor matter."""
    g = torch.Generator().manual_seed(7)
    r = lambda *s, std=0.2: torch.randn(*s, generator=g) * std
    sd = {"transformer.wte.weight": r(V, C), "transformer.wpe.weight": r(T, C, std=0.1)}
    for l in range(n_layer):
        p = f"transformer.h.{l}."
        sd[p + "ln_1.weight"] = 1.0 + r(C, std=0.1)
        sd[p + "ln_1.bias"] = r(C, std=0.1)
        sd[p + "attn.bias"] = torch.tril(torch.ones(T, T)).view(1, 1, T, T)
        sd[p + "attn.masked_bias"] = torch.tensor(-1e4)
        sd[p + "attn.c_attn.weight"] = r(C, 3 * C)
        sd[p + "attn.c_attn.bias"] = r(3 * C, std=0.1)
        sd[p + "attn.c_proj.weight"] = r(C, C)
        sd[p + "attn.c_proj.bias"] = r(C, std=0.1)
        sd[p + "ln_2.weight"] = 1.0 + r(C, std=0.1)
        sd[p + "ln_2.bias"] = r(C, std=0.1)
        sd[p + "mlp.c_fc.weight"] = r(C, 4 * C)
        sd[p + "mlp.c_fc.bias"] = r(4 * C, std=0.1)
        sd[p + "mlp.c_proj.weight"] = r(4 * C, C, std=0.1)
        sd[p + "mlp.c_proj.bias"] = r(C, std=0.1)
    sd["transformer.ln_f.weight"] = 1.0 + r(C, std=0.1)
    sd["transformer.ln_f.bias"] = r(C, std=0.1)
    sd["lm_head.weight"] = sd["transformer.wte.weight"].clone()
    return sd


def save_logits(path, logits):
    np.savetxt(path, logits.numpy(), fmt="%.9g")


def main():
    cmd = sys.argv[1]
    if cmd in ("make", "logits"):
        path, out = sys.argv[2:4]
        n_layer, n_head, C, T, V = (int(v) for v in sys.argv[4].split(","))
        tokens = [int(t) for t in sys.argv[5].split(",")]
        if cmd == "make":
            sd = make(n_layer, n_head, C, T, V)
            write_safetensors(path, sd, {"format": "pt"})
        else:
            sd, meta = read_safetensors(path)
            assert meta.get("layout") == "huggingface", meta
            assert "lm_head.weight" not in sd  # tied: transformers re-ties it on load
        save_logits(out, forward(sd, tokens, n_layer, n_head))
    elif cmd == "compare":
        a, b = np.loadtxt(sys.argv[2], ndmin=2), np.loadtxt(sys.argv[3], ndmin=2)
        tol = float(sys.argv[4])
        assert a.shape == b.shape, (a.shape, b.shape)
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err <= tol, f"logits differ: max |a - b| / max |b| = {err:.3g} > {tol}"
        print(f"logits agree: {a.shape[0]} positions x {a.shape[1]}, relative error {err:.3g} <= {tol}")
    elif cmd == "same":
        a, _ = read_safetensors(sys.argv[2])
        b, _ = read_safetensors(sys.argv[3])
        a = {k: v for k, v in strip(a).items() if not k.endswith((".attn.bias", ".attn.masked_bias")) and k != "lm_head.weight"}
        b = strip(b)
        assert set(a) == set(b), sorted(set(a) ^ set(b))
        for k in a:
            assert a[k].shape == b[k].shape and torch.equal(a[k], b[k]), k
        print(f"same tensors: {len(a)}")
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
