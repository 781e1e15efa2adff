#!/usr/bin/env bash
# Every CPU benchmark back to back, for the figures in docs/user/performance.md
# (dated runs: bench/results/). Each benchmark checks its own result and prints its figure as
# a ratio against a reference measured in the same run (bench/README.md).
# Run it on an idle machine: other work on the same cores moves the two sides differently.
#
#   bench/run_all.sh [--quick] [--no_build] [BUILD_DIR=build] [OUT_DIR=bench-results]
#
#   --quick     short runs (smaller sizes, fewer steps and repeats; about 3 minutes on 2
#               cores): checks that every benchmark runs and is right, not a measurement
#   --no_build  use the binaries as they are (default: build the bench targets first)
#
# Writes OUT_DIR/<run>.txt (each run's output, the load average before it), every run's
# record lines into OUT_DIR/results.jsonl (one JSON object per line, "bench" names the
# program) and the summary table into OUT_DIR/results.md, which it also prints. Exit status
# 1 when any run failed (a wrong result, a crash), else 0.
set -uo pipefail
quick=0
build_first=1
pos=()
for a in "$@"; do
  case $a in
    --quick) quick=1 ;;
    --no_build) build_first=0 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "run_all.sh: error: unknown flag $a (see --help)" >&2; exit 2 ;;
    *) pos+=("$a") ;;
  esac
done
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build_arg=${pos[0]:-$root/build}
[ -d "$build_arg" ] || { echo "run_all.sh: error: build directory $build_arg does not exist" >&2; exit 2; }
build=$(cd "$build_arg" && pwd)
out=${pos[1]:-$root/bench-results}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
source scripts/mpi_env.sh

targets=(comm_bench optim_bench bench_train bench_train_engine bench_gemm_shapes bench_peak zero_bench
         page_release_bench bench_checkpoint pipe_bench)
[ "$quick" = 1 ] || targets+=(train)
if [ "$build_first" = 1 ]; then
  cmake --build "$build" --target "${targets[@]}" || { echo "run_all.sh: error: the build failed" >&2; exit 1; }
fi

: >"$out/results.jsonl"
failed=()
run() {  # run NAME CMD...: one run, its output and the load before it; its records to results.jsonl
  local name=$1
  shift
  echo "== $name ($(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))" | tee "$out/$name.txt"
  "$@" 2>&1 | tee -a "$out/$name.txt"
  local rc=${PIPESTATUS[0]}
  grep '^JSON: ' "$out/$name.txt" | sed 's/^JSON: //' >>"$out/results.jsonl"
  if [ "$rc" != 0 ]; then
    failed+=("$name (exit $rc)")
    echo "== $name: FAILED (exit $rc)"
  fi
}

mpi="mpirun --oversubscribe --bind-to none"
ckpt_dir=$(mktemp -d)
trap 'rm -rf "$ckpt_dir"' EXIT
if [ "$quick" = 1 ]; then
  for np in 2 4; do
    run "comm_np$np" $mpi -np "$np" "$build/bench/comm/comm_bench" --max_size 16M --warmup 1 --budget 0.05
  done
  run optim bash bench/optim/run.sh "$build" --sizes 10000000 --repeats 3
  run train bash bench/train/run.sh "$build" 3
  run gemm_shapes env OMP_NUM_THREADS=1 "$build/bench/train/bench_gemm_shapes" --reps 3
  run peak "$build/bench/train/bench_peak"
  run zero bash bench/zero/run.sh "$build" --steps 3 --warmup 1
  run checkpoint bash bench/checkpoint/run.sh "$build" 10000000 1 "$ckpt_dir/ckpt"
  for np in 2 4; do
    run "pipe_np$np" env OMP_NUM_THREADS=1 $mpi -np "$np" "$build/bench/pipe/pipe_bench" --layers 4 --embd 64 --seq 32 \
      --vocab 256 --steps 3 --warmup 1 --min_ratio 0
  done
else
  run default_train bash -c "time mpirun -np 2 '$build/apps/train/train' --config configs/default.json 2>&1 | tail -3"
  for np in 2 4; do
    run "comm_np$np" $mpi -np "$np" "$build/bench/comm/comm_bench" --warmup 1 --budget 0.2
  done
  run optim bash bench/optim/run.sh "$build"
  run train bash bench/train/run.sh "$build"
  run gemm_shapes env OMP_NUM_THREADS=1 "$build/bench/train/bench_gemm_shapes"
  run peak "$build/bench/train/bench_peak"
  run zero bash bench/zero/run.sh "$build"
  run checkpoint bash bench/checkpoint/run.sh "$build" 100000000 3 "$ckpt_dir/ckpt"
  for np in 2 4; do  # 4 ranks oversubscribe 2 cores: the run says so
    run "pipe_np$np" env OMP_NUM_THREADS=1 $mpi -np "$np" "$build/bench/pipe/pipe_bench" --steps 20
  done
fi
# TorchScript training against PyTorch, where train was built with torch support.
if ldd "$build/apps/train/train" 2>/dev/null | grep -q libtorch; then
  if [ "$quick" = 1 ]; then
    run torch /usr/bin/python3 bench/torch/torch_bench.py --build "$build" --rounds 1 --steps 12 --batch 32 \
      --features 64 --hidden 128 --layers 2
    run zero3_memory /usr/bin/python3 bench/torch/zero3_memory.py --build "$build" --ranks 2 --steps 2 \
      --blocks 2 --width 256 --max_ratio 0
  else
    run torch /usr/bin/python3 bench/torch/torch_bench.py --build "$build"
    run zero3_memory /usr/bin/python3 bench/torch/zero3_memory.py --build "$build"
  fi
fi

# The summary: one row per record (the PyTorch references have no check or headline).
/usr/bin/python3 - "$out/results.jsonl" >"$out/results.md" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
keys = ("impl", "cpu_isa", "dtype", "ranks", "world", "threads", "stage", "in_place")
print("| bench | setup | checks | headline | ratio | min_ratio | verdict |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for r in recs:
    setup = ", ".join(f"{k} {json.dumps(r[k]).strip(chr(34))}" for k in keys if k in r)
    checks = r.get("checks")
    passed = "-" if checks is None else f"{sum(c['ok'] for c in checks)}/{len(checks)} passed"
    ratio = r.get("ratio")
    verdict = "-" if "ok" not in r else "ok" if r["ok"] else "FAILED"
    print(f"| {r['bench']} | {setup} | {passed} | {r.get('headline', 'reference')} | "
          f"{'-' if ratio is None else format(ratio, '.3f')} | {format(r['min_ratio'], 'g') if 'min_ratio' in r else '-'} | {verdict} |")
PY
echo
cat "$out/results.md"
echo
echo "run_all: $(wc -l <"$out/results.jsonl") records in $out/results.jsonl, outputs in $out"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'run_all: FAILED: %s\n' "${failed[@]}" >&2
  exit 1
fi
