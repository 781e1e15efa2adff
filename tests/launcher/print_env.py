#!/usr/bin/env python3
"""Rank program for dsrun tests: writes {"argv": [...], "env": {...}} to
$DS_PRINT_ENV_DIR/<RANK>.json (no MPI needed: a plain script, as under DeepSpeed)."""
import json
import os
import sys

out = os.path.join(os.environ["DS_PRINT_ENV_DIR"], os.environ.get("RANK", "norank") + ".json")
with open(out + ".tmp", "w", encoding="utf-8", errors="surrogateescape") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, f)
os.rename(out + ".tmp", out)
