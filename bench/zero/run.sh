#!/usr/bin/env bash
# ZeRO stages 0-3 at 2 and 4 ranks on the built-in GPT: memory per rank, step time,
# rank 0's CPU time and page faults per step (bench/README.md; the
# logs in bench/results), then what releasing ZeRO-2's gradient pages costs (page_release_bench). Each run
# also checks its result against stage 0 in the same process and prints its record line
# ("JSON: {...}", bench/README.md); a wrong result stops the script.
#   bench/zero/run.sh [BUILD_DIR] [extra zero_bench flags...]
set -euo pipefail
build=${1:-build}
shift || true
exe=$build/bench/zero/zero_bench
[[ -x $exe ]] || { echo "run.sh: error: $exe not built (cmake --build $build --target zero_bench)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
out=$(mktemp)
for np in 2 4; do
  for stage in 0 1 2 3; do
    mpirun --oversubscribe --bind-to none -np $np "$exe" --stage $stage "$@" | grep '^stage=\|^JSON: ' | tee -a "$out"
  done
done
/usr/bin/python3 - "$out" <<'PY'
import sys
rows = [dict(kv.split("=") for kv in line.split()) for line in open(sys.argv[1]) if line.startswith("stage=")]
mib = lambda b: int(b) / 2**20
print()
print(f"GPT, {rows[0]['params']} parameters, {rows[0]['precision']} + AdamW; per rank; engine = bytes the engine holds (ZeRO-2 grads: resident pages; stage 3: partitions + gathered pages), formula = ZeRO paper (stage 3: 18 bytes/param / N)")
print()
print("| ranks | stage | step ms | vs stage 0 | CPU ms/step | page faults/step | VmHWM MiB | params MiB (engine / formula) | grads MiB (engine / formula) | grad buckets peak MiB | master+optim MiB (engine / formula) | model states: engine / formula |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
base = {}
for r in rows:
    w, s = int(r["world"]), int(r["stage"])
    if s == 0: base[w] = float(r["step_ms"])
    eg, fg = int(r["engine_grads"]), int(r["formula_grads"])
    ep, fp = int(r["engine_params"]), int(r["formula_params"])
    eo = int(r["engine_master"]) + int(r["engine_optim"]); fo = int(r["formula_master"]) + int(r["formula_optim"])
    print(f"| {w} | {s} | {float(r['step_ms']):.1f} | {float(r['step_ms'])/base[w]:.3f} | {float(r['cpu_ms']):.1f} | "
          f"{float(r['faults']):.0f} | {float(r['vmhwm_mib']):.1f} | {mib(ep):.2f} / {mib(fp):.2f} | "
          f"{mib(eg):.2f} / {mib(fg):.2f} | {mib(int(r['engine_grad_buckets'])):.2f} | {mib(eo):.1f} / {mib(fo):.1f} | {(ep+eg+eo)/(fp+fg+fo):.3f} |")
PY
rm -f "$out"
# The cost of ZeRO-2's page release per micro-step at this model's gradient size (fp16).
pr=$build/bench/zero/page_release_bench
if [[ -x $pr ]]; then echo; "$pr" --mib 13.8 --bucket-mib 3.8; fi
