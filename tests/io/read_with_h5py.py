#!/usr/bin/python3
"""Reads a dstrain checkpoint with nothing but h5py + numpy (docs/user/checkpoints.md).

usage: read_with_h5py.py SAVE_DIR [--expect-client-state]
Checks every dataset against the manifest's CRC-32C, decodes the state trees (engine,
client_state) into Python values, and re-assembles the flat fp32 master from the shards.
"""
import json
import os
import sys

import h5py
import numpy as np

from crc32c_ref import crc32c


def as_float32(ds):
    """A parameter dataset as float32: bf16 is stored as uint16 with attrs['dtype'] == 'bf16'."""
    a = ds[()]
    if ds.attrs.get("dtype") == "bf16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def decode(node):
    """A state tree node (group or dataset with attrs['ds_kind']) as a Python value."""
    kind = node.attrs["ds_kind"]
    if kind == "map":
        return {name_of(k): decode(node[k]) for k in node}
    if kind == "list":
        return [decode(node[str(i)]) for i in range(int(node.attrs["length"]))]
    if kind == "null":
        return None
    if kind == "bool":
        return bool(node[()])
    if kind == "int64":
        return int(node[()])
    if kind == "double":
        return float(node[()])
    if kind == "string":
        v = node[()]
        return v.decode() if isinstance(v, bytes) else v
    if kind == "tensor":
        return np.asarray(node[()], dtype=np.float32)
    raise ValueError(f"{node.name}: unknown ds_kind {kind}")


def name_of(k):
    """HDF5 member name -> map key ('%25' -> '%', '%2F' -> '/', '%.' prefix for '' and '.')."""
    if k.startswith("%."):
        k = k[2:]
    return k.replace("%2F", "/").replace("%25", "%")


def main():
    save_dir = sys.argv[1]
    with open(os.path.join(save_dir, "latest")) as f:
        tag = f.read().strip()
    ckpt = os.path.join(save_dir, tag)
    with open(os.path.join(ckpt, "manifest.json")) as f:
        man = json.load(f)
    assert man["format_version"] == 1, man["format_version"]
    sums = man["checksums"]
    checked = 0
    with h5py.File(os.path.join(ckpt, "model_states.h5"), "r") as model:
        assert model.attrs["format_version"] == 1
        params = {}
        # params_in_master (ZeRO stage 3): no params/<name>; the weights are the fp32 master
        in_master = man.get("params_in_master", False)
        assert in_master == ("params" not in model), in_master
        for p in ([] if in_master else man["params"]):
            ds = model["params"][p["name"]]
            assert list(ds.shape) == p["shape"], (p["name"], ds.shape, p["shape"])
            want = int(sums["model_states.h5"]["params/" + p["name"]].split(":")[1], 16)
            got = crc32c(ds[()].tobytes())
            assert got == want, f"{p['name']}: crc {got:08x} != {want:08x}"
            checked += 1
            params[p["name"]] = as_float32(ds)
        engine = decode(model["engine"])
        client = decode(model["client_state"])
        config = json.loads(model.attrs["config"])
    flat = np.zeros(man["flat_numel"], dtype=np.float32)
    # A file holds one range (position 0), or several end to end (multi-range: "position").
    length = {}
    for part in man["partitions"]:
        length[part["file"]] = max(length.get(part["file"], 0), part.get("position", 0) + part["count"])
    seen = set()
    for part in man["partitions"]:
        with h5py.File(os.path.join(ckpt, part["file"]), "r") as shard:
            if "position" not in part:
                assert shard.attrs["offset"] == part["offset"] and shard.attrs["count"] == part["count"]
            for name in ([] if part["file"] in seen else man["shard_datasets"]):
                a = shard[name][()]
                assert a.dtype == np.float32 and a.shape == (length[part["file"]],)
                want = int(sums[part["file"]][name].split(":")[1], 16)
                assert crc32c(a.tobytes()) == want, f"{part['file']}:{name} checksum"
                checked += 1
            seen.add(part["file"])
            pos = part.get("position", 0)
            flat[part["offset"]:part["offset"] + part["count"]] = shard["fp32_master"][pos:pos + part["count"]]
    # The working weights are the fp32 master rounded to the working dtype.
    for p in ([] if in_master else man["params"]):
        master = flat[p["flat_offset"]:p["flat_offset"] + p["numel"]].reshape(p["shape"])
        w = params[p["name"]]
        if man["working_dtype"] == "fp32":
            assert np.array_equal(master, w), p["name"]
        else:
            assert np.allclose(master, w, rtol=1e-2, atol=1e-3), p["name"]
    assert isinstance(engine["global_steps"], int) and engine["global_steps"] > 0
    assert isinstance(engine["loss_scaler"]["cur_scale"], float)
    if "--expect-client-state" in sys.argv:
        assert client["sampler"]["next_step"] == engine["global_steps"], client
        assert client["note"] == "resume-test"
        assert client["rng"].shape == (2, 2)
    print(f"read_with_h5py: {ckpt}: {len(man['params'])} params ({man['working_dtype']}), "
          f"{len(man['partitions'])} shard(s) of {man['world_size']} rank(s), ZeRO {man['zero_stage']}, "
          f"{checked} checksums OK, global_steps {engine['global_steps']}, client_state keys {sorted(client)}, "
          f"train_batch_size {config.get('train_batch_size')}")


if __name__ == "__main__":
    main()
