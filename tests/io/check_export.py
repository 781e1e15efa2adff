#!/usr/bin/python3
"""Checks ds_to_fp32 output: safetensors parsed by hand (struct + json), values compared with
the HDF5 export and with the checkpoint's fp32 master read through h5py; then loaded into torch.

usage: check_export.py SAVE_DIR OUT.h5 OUT.safetensors
"""
import json
import os
import struct
import sys

import h5py
import numpy as np

save_dir, out_h5, out_st = sys.argv[1:4]
tag = open(os.path.join(save_dir, "latest")).read().strip()
ckpt = os.path.join(save_dir, tag)
man = json.load(open(os.path.join(ckpt, "manifest.json")))
flat = np.zeros(man["flat_numel"], dtype=np.float32)
for part in man["partitions"]:
    with h5py.File(os.path.join(ckpt, part["file"]), "r") as s:
        pos = part.get("position", 0)  # multi-range shards: where the range sits in the file
        flat[part["offset"]:part["offset"] + part["count"]] = s["fp32_master"][pos:pos + part["count"]]

raw = open(out_st, "rb").read()
(hlen,) = struct.unpack("<Q", raw[:8])
assert hlen % 8 == 0, hlen
header = json.loads(raw[8:8 + hlen])
data = raw[8 + hlen:]
meta = header.pop("__metadata__")
assert meta["tag"] == tag, meta
end = 0
tensors = {}
for p in man["params"]:
    h = header[p["name"]]
    assert h["dtype"] == "F32" and h["shape"] == p["shape"], h
    b, e = h["data_offsets"]
    end = max(end, e)
    tensors[p["name"]] = np.frombuffer(data[b:e], dtype="<f4").reshape(p["shape"])
assert end == len(data), (end, len(data))
assert set(header) == {p["name"] for p in man["params"]}
with h5py.File(out_h5, "r") as f:
    for p in man["params"]:
        want = flat[p["flat_offset"]:p["flat_offset"] + p["numel"]].reshape(p["shape"])
        assert np.array_equal(tensors[p["name"]], want), p["name"]
        assert np.array_equal(f[p["name"]][()], want), p["name"]
try:
    import torch
    sd = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    total = sum(t.numel() for t in sd.values())
    torch_note = f", loaded into torch ({total} elements)"
except ImportError:
    torch_note = ""
print(f"check_export: {len(tensors)} tensors equal to the fp32 master in {ckpt}{torch_note}")
