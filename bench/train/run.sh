#!/usr/bin/env bash
# Training throughput, side by side (issue 6 item 7): the built-in GPT (4 layers, 4 heads,
# 256 wide, context 128, vocab 256, micro-batch 8 per rank, AdamW) through the engine on
# 1 rank x 2 threads and 2 ranks x 1 thread, fp32 and bf16, against the same model in
# PyTorch 1.13 (one process x 2 threads, DDP over gloo 2 x 1), plus the compute bound
# (model FLOPs/token over the sgemm rate OpenBLAS reaches here, measured in this run).
#
#   bench/train/run.sh [build-dir] [steps]        (not a test; prints a markdown table)
#
# Both sides get the same BLAS setup: OpenBLAS (openmp build) with OPENBLAS_CORETYPE=SkylakeX
# (0.3.21 does not recognise this CPU and would run its SSE3 kernel) and the glibc malloc
# tunables that keep freed memory mapped (torch re-faults fresh pages every step without).
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${DS_SYSTEM_PYTHON:-/usr/bin/python3}
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
export GLIBC_TUNABLES=glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=17179869184
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none -x OPENBLAS_CORETYPE -x GLIBC_TUNABLES -x OMP_NUM_THREADS"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

run() { echo "# $*" >&2; "$@" | grep '^{' | tee -a "$OUT" >&2; }

# Ours without the engine (bound measurement included), 2 and 1 threads.
OMP_NUM_THREADS=2 run "$BUILD/bench/train/bench_train" --json --steps "$STEPS"
OMP_NUM_THREADS=1 run "$BUILD/bench/train/bench_train" --json --steps "$STEPS"
if [ -x "$BUILD/bench/train/bench_train_engine" ]; then
  for dt in fp32 bf16; do
    OMP_NUM_THREADS=2 run $MPIRUN -np 1 "$BUILD/bench/train/bench_train_engine" --dtype $dt --steps "$STEPS"
    OMP_NUM_THREADS=1 run $MPIRUN -np 2 "$BUILD/bench/train/bench_train_engine" --dtype $dt --steps "$STEPS"
  done
fi
# PyTorch with OpenBLAS loaded (Debian's torch links the reference BLAS otherwise).
export LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
OMP_NUM_THREADS=2 run "$PY" "$HERE/torch_gpt.py" --ranks 1 --threads 2 --steps "$STEPS"
OMP_NUM_THREADS=1 run "$PY" "$HERE/torch_gpt.py" --ranks 2 --threads 1 --steps "$STEPS"

"$PY" - "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
own2 = next(r for r in rows if r["impl"] == "dstrain" and r["threads"] == 2)
fpt = own2["flops_per_token"]
gf2 = max(own2["sgemm_gflops_model"], own2["sgemm_gflops_1024"])
bound = gf2 * 1e9 / fpt
torch1 = next((r for r in rows if r["impl"] == "pytorch" and r["ranks"] == 1), None)
base = torch1["tokens_per_s"] if torch1 else None
print(f"model: {fpt/1e6:.1f} MFLOP/token; OpenBLAS sgemm (core {own2['openblas_core']}, 2 threads): "
      f"{gf2:.0f} GFLOP/s -> compute bound {bound:.0f} tokens/s (2 cores)")
print()
print("| implementation | dtype | ranks x threads | tokens/s | % of bound | vs PyTorch 1x2 fp32 |")
print("| --- | --- | --- | --- | --- | --- |")
for r in rows:
    ranks = r.get("ranks", 1)
    name = {"dstrain": "dstrain, own loop (no engine)", "dstrain-engine": "dstrain engine",
            "pytorch": "PyTorch 1.13" + (" DDP gloo" if ranks > 1 else "")}[r["impl"]]
    tps = r["tokens_per_s"]
    pct = 100 * tps / bound if (ranks * r["threads"]) == 2 else 100 * tps / (bound / 2)
    vs = f"{tps / base:.2f}x" if base else "-"
    print(f"| {name} | {r.get('dtype', 'fp32')} | {ranks} x {r['threads']} | {tps:.0f} | {pct:.0f}% | {vs} |")
if torch1:
    print(f"\nPyTorch matmul at n=1024: {torch1['matmul_gflops_1024']} GFLOP/s (OpenBLAS loaded if >> 5)")
PYEOF
