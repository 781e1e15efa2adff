#!/usr/bin/env bash
# The prepared GPU check: configure and build the CMake project in Release with CUDA (the
# same configure as scripts/test.sh, plus the CUDA options), then, on a GPU, run tests/cuda
# (and the NcclComm tests when NCCL is there), the optimizer benchmark, GPU training runs and
# the GPT benchmark, and print ONE table. Sized to end in well under 8 minutes: every step has
# its own timeout, and the whole run has a budget.
#
#   bench/gpu_check.sh [--build-only] [--arch 90] [--build-dir DIR] [--params N]
#
#   --build-only  no GPU needed: configure and build, then stop (exit 0)
#   --arch        CUDA architectures (default: the visible GPU's, e.g. 90 on an H100/H200;
#                 "80;90" without a GPU)
#   --build-dir   default build-gpucheck (under the repository root)
#   --params      parameters for optim_bench_cuda (default 100000000)
#
# Everything printed also goes to $OUT/gpu_check.txt when $OUT is set (the device tool's
# output folder), else to <build-dir>/gpu_check.txt.
# Exit status: 0 every step passed (tests may skip: NCCL at 2 ranks needs 2 GPUs), 1 a step
# failed or timed out, 2 a tool is missing, 3 bad usage, 77 built but no GPU visible.
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build_only=0
arch=""
build="$root/build-gpucheck"
params=100000000
while [ $# -gt 0 ]; do
  case "$1" in
    --build-only) build_only=1 ;;
    --arch) arch=${2:?--arch needs a value}; shift ;;
    --build-dir) build=${2:?--build-dir needs a value}; shift ;;
    --params) params=${2:?--params needs a value}; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "gpu_check: error: unknown argument '$1' (see --help)" >&2; exit 3 ;;
  esac
  shift
done
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac

mkdir -p "$build" || { echo "gpu_check: error: cannot create the build folder $build" >&2; exit 2; }
if [ -n "${OUT:-}" ] && mkdir -p "$OUT" 2>/dev/null; then
  log="$OUT/gpu_check.txt"
else
  log="$build/gpu_check.txt"
fi
: >"$log"
exec > >(tee -a "$log") 2>&1
tee_pid=$!

T0=$SECONDS
BUDGET=${DS_GPU_CHECK_BUDGET:-450}  # seconds for the whole check (the check is meant to take under 8 minutes)
rows=()     # "step|result|seconds|detail"
failed=0

say() { echo "gpu_check: $*"; }
row() { rows+=("$1|$2|$3|$4"); case "$2" in FAIL|TIMEOUT) failed=1 ;; esac; }
left() { echo $((BUDGET - (SECONDS - T0))); }

# timed NAME LIMIT CMD...: runs CMD under a timeout no longer than what the budget has left;
# sets $rc and $secs.
timed() {
  local name=$1 limit=$2
  shift 2
  local l
  l=$(left)
  if [ "$l" -lt "$limit" ]; then limit=$l; fi
  if [ "$limit" -le 5 ]; then
    say "$name: no time left in the ${BUDGET}s budget"
    rc=124
    secs=0
    return
  fi
  say "== $name (timeout ${limit}s, $(date -u +%H:%M:%S) UTC)"
  local t=$SECONDS
  timeout --kill-after=10 "$limit" "$@"
  rc=$?
  secs=$((SECONDS - t))
}

print_table() {
  echo
  echo "## dstrain GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "GPU: ${gpu_desc:-none visible}"
  echo
  echo "| step | result | s | detail |"
  echo "| --- | --- | --- | --- |"
  local r
  for r in "${rows[@]}"; do
    IFS='|' read -r a b c d <<<"$r"
    echo "| $a | $b | $c | $d |"
  done
  echo
  echo "total: $((SECONDS - T0)) s; log: $log"
}

finish() {
  print_table
  exec >&- 2>&-
  wait "$tee_pid" 2>/dev/null
  exit "$1"
}

# ---- 1. Is a GPU visible? (never hangs: nvidia-smi runs under a timeout) -------------------
gpu_desc=""
gpu_cc=""
gpu_why=""
ngpu=0
if [ "${CUDA_VISIBLE_DEVICES-unset}" = "" ] || [ "${CUDA_VISIBLE_DEVICES-}" = "-1" ]; then
  gpu_why="CUDA_VISIBLE_DEVICES='${CUDA_VISIBLE_DEVICES}' hides every GPU"
elif command -v nvidia-smi >/dev/null 2>&1; then
  if q=$(timeout 30 nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader 2>&1) &&
     [ -n "$q" ]; then
    gpu_desc=$(echo "$q" | head -1 | sed 's/, */, /g')
    gpu_cc=$(echo "$q" | head -1 | cut -d, -f2 | tr -d ' .')
    [ "$(echo "$q" | wc -l)" -gt 1 ] && gpu_desc="$gpu_desc (+$(($(echo "$q" | wc -l) - 1)) more)"
  elif l=$(timeout 30 nvidia-smi -L 2>/dev/null) && echo "$l" | grep -q '^GPU'; then
    gpu_desc=$(echo "$l" | head -1)  # a driver too old for --query-gpu=compute_cap
  else
    gpu_why="nvidia-smi failed: $(echo "$q" | head -2 | tr '\n' ' ')"
  fi
  [ -n "$gpu_desc" ] && ngpu=$( (timeout 30 nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' )
elif ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  ngpu=$(ls /dev/nvidia[0-9]* | wc -l)
  gpu_desc="$ngpu device node(s) /dev/nvidia*, no nvidia-smi"
else
  gpu_why="no nvidia-smi and no /dev/nvidia* device node"
fi
if [ -z "$gpu_desc" ]; then
  say "no GPU visible ($gpu_why): building only; the tests and benchmarks need a GPU"
  row "GPU" "none" 0 "no GPU visible: $gpu_why"
else
  say "GPU: $gpu_desc"
  row "GPU" "ok" 0 "$gpu_desc"
fi
if [ -z "$arch" ]; then
  if [ -n "$gpu_cc" ]; then arch=$gpu_cc; else arch="80;90"; fi
fi

# ---- 2. Tools -----------------------------------------------------------------------------
nvcc=${CUDACXX:-}
[ -z "$nvcc" ] && nvcc=$(command -v nvcc 2>/dev/null || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
cxx=$(command -v c++ 2>/dev/null || command -v g++ 2>/dev/null || true)
missing=()
[ -z "$nvcc" ] && missing+=("nvcc (CUDA toolkit: set CUDACXX or PATH)")
[ -z "$cxx" ] && missing+=("a C++20 compiler (g++)")
command -v cmake >/dev/null 2>&1 || missing+=("cmake (scripts/install_deps.sh)")
if [ ${#missing[@]} -gt 0 ]; then
  say "error: missing: ${missing[*]}"
  row "tools" "FAIL" 0 "missing: ${missing[*]}"
  finish 2
fi
nvcc_ver=$("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
row "tools" "ok" 0 "nvcc $nvcc_ver ($nvcc), $($cxx --version | head -1), cmake $(cmake --version 2>/dev/null | head -1 | awk '{print $3}')"
export CUDACXX=$nvcc
jobs=$(nproc 2>/dev/null || echo 4)

# ---- 3a. Configure: the CMake project (needs the Debian packages of scripts/install_deps.sh)
gen=()
command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
# An existing cache from another generator would make cmake refuse: start clean then.
if [ -f "$build/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${gen[1]:-Unix Makefiles}\$" "$build/CMakeCache.txt"; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
timed "configure (CMake, Release, CUDA arch $arch)" 180 \
  cmake "${gen[@]}" -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDS_BUILD_TESTS=ON -DDS_BUILD_BENCH=ON \
  -DDS_WITH_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=$arch" "-DCMAKE_CUDA_COMPILER=$nvcc" >"$build/configure.log" 2>&1
if [ "$rc" != 0 ]; then
  say "the CMake project did not configure (rc $rc); what it lacks:"
  grep -E "Could NOT find|not found|FATAL_ERROR|CMake Error" "$build/configure.log" | head -8
  if command -v dpkg-query >/dev/null 2>&1; then
    miss=()
    for p in libopenmpi-dev openmpi-bin libhdf5-dev libcli11-dev nlohmann-json3-dev libgtest-dev libopenblas-dev; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || miss+=("$p")
    done
    [ ${#miss[@]} -gt 0 ] && say "Debian packages of scripts/install_deps.sh missing here: ${miss[*]}"
  fi
  row "configure" "$([ "$rc" = 124 ] && echo TIMEOUT || echo FAIL)" "$secs" "CMake project (see $build/configure.log)"
  finish 1
fi
nccl=OFF
grep -qE '^--   NCCL +: ON' "$build/configure.log" && nccl=ON
grep -E "^--   (CUDA|NCCL|MPI) " "$build/configure.log"
row "configure" "ok" "$secs" "CMake project, arch $arch"

# ---- 3b. Build ------------------------------------------------------------------------------
declare -A exe
targets=(test_cuda_optim_kernels test_cuda_step optim_bench_cuda test_cuda_nn_kernels test_cuda_gpt test_cuda_flash
         bench_layers_cuda test_cuda_engine train bench_gpt_cuda test_cuda_llama_kernels test_cuda_llama
         test_staged_comm test_cuda_engine_staged)
[ "$nccl" = ON ] && targets+=(test_cuda_engine_mpi test_nccl)
timed "build ${targets[*]}" 420 cmake --build "$build" --target "${targets[@]}" -j "$jobs"
if [ "$rc" != 0 ]; then
  row "build" "$([ "$rc" = 124 ] && echo TIMEOUT || echo FAIL)" "$secs" "cmake --build ${targets[*]} (rc $rc)"
  finish 1
fi
row "build" "ok" "$secs" "${targets[*]} (CMake, -j$jobs)"
exe[optim_bench_cuda]=$build/bench/optim/optim_bench_cuda
exe[train]=$build/apps/train/train
exe[bench_gpt_cuda]=$build/bench/gpu/bench_gpt_cuda

if [ "$build_only" = 1 ]; then
  row "tests, benchmarks" "not run" 0 "--build-only"
  finish 0
fi
if [ -z "$gpu_desc" ]; then
  say "built; no GPU visible ($gpu_why): the CUDA tests and GPU benchmarks need one (exit 77)"
  row "tests, benchmarks" "not run" 0 "no GPU visible"
  finish 77
fi

# ---- 4. Tests -------------------------------------------------------------------------------
result_of() {  # exit code -> table word
  case "$1" in 0) echo PASS ;; 77) echo SKIP ;; 124|137) echo TIMEOUT ;; *) echo FAIL ;; esac
}
# A test that skips (exit 77: the CUDA runtime sees no device) although nvidia-smi showed a
# GPU is a failure of this check (driver/runtime mismatch, hidden device...).
skip_verdict() {
  [ "$1" = SKIP ] || return 0
  if [ -n "$gpu_desc" ]; then
    res=FAIL
    detail="skipped (exit 77) although a GPU is visible: the CUDA runtime sees none (driver too old for CUDA $nvcc_ver?)"
  else
    detail="skipped: no GPU visible"
  fi
}
# ctest runs tests/cuda (label cuda) and, with NCCL, the NcclComm tests at 1 and 2 ranks
# (their entries carry the mpirun command line and its root-safe environment). NCCL
# refuses two ranks on one GPU ("Duplicate GPU detected"), so np2 skips on a 1-GPU machine.
regex='^cuda[.]'
[ "${nccl:-OFF}" = ON ] && regex='^cuda[.]|^mpi_nccl_np[12]$'
timed "ctest -R '$regex'" 300 bash -c "ctest --test-dir '$build' -R '$regex' -V >'$build/ctest.txt' 2>&1; rc=\$?; cat '$build/ctest.txt'; exit \$rc"
ctest_rc=$rc
ctest_secs=$secs
n=0
while IFS='|' read -r name verdict tsec; do
  [ -z "$name" ] && continue
  n=$((n + 1))
  verdict=$(echo "$verdict" | tr -d ' ')
  case "$verdict" in Passed) res=PASS ;; Skipped) res=SKIP ;; Timeout) res=TIMEOUT ;; *) res=FAIL ;; esac
  case "$name" in
    cuda.nn_kernels) detail="GPT layer kernels vs the CPU references, fp32/fp16/bf16" ;;
    cuda.gpt) detail="GptCuda loss and gradients vs the CPU Gpt; a short bf16 training" ;;
    cuda.gpt_attention_blocks) detail="the same with 8-row block-causal attention GEMMs" ;;
    cuda.gpt_flash_attention) detail="the same with flash attention (--attention flash)" ;;
    cuda.flash_attention) detail="flash attention fwd/bwd vs a double reference, fp16/bf16" ;;
    cuda.engine) detail="the Engine on the GPU vs on the CPU; checkpoints GPU <-> CPU; fp16 overflow skips" ;;
    cuda.engine_np2) detail="the Engine on 2 GPUs over NCCL (ZeRO 0/1) vs one process with the whole batch" ;;
    cuda.staged_comm_np*) detail="StagedComm (pinned host staging over MPI) vs MpiComm, ranks sharing the GPU" ;;
    cuda.engine_staged_np*) detail="the Engine with 2/4 ranks sharing one GPU over StagedComm (ZeRO 0/1/2, fp32/bf16) vs one process" ;;
    cuda.device_paged_buffer) detail="ZeRO-2's device gradient buffer: chunks mapped/zeroed/released, memory freed, driver errors" ;;
    cuda.*) detail="kernels vs the CPU references (tests/cuda)" ;;
    *) detail="NcclComm all_reduce/reduce_scatter/all_gather on device buffers vs exact sums" ;;
  esac
  if [ "$res" = SKIP ] && { [ "$name" = mpi_nccl_np2 ] || [ "$name" = cuda.engine_np2 ]; } && [ "$ngpu" = 1 ]; then
    detail="skipped: NCCL needs one GPU per rank (1 visible)"
  else
    skip_verdict "$res"
  fi
  row "$name" "$res" "${tsec%.*}" "$detail"
done < <(sed -n 's/^ *[0-9]*\/[0-9]* Test *#[0-9]*: \([^ ]*\) \.*\**\([A-Za-z ]*[A-Za-z]\) *\([0-9.]*\) sec.*/\1|\2|\3/p' "$build/ctest.txt")
if [ "$n" = 0 ]; then
  row "ctest" "FAIL" "$ctest_secs" "rc $ctest_rc and no test verdict found in $build/ctest.txt"
elif [ "$ctest_rc" != 0 ] && [ "$failed" = 0 ]; then
  row "ctest" "$(result_of "$ctest_rc")" "$ctest_secs" "rc $ctest_rc after $n verdicts (see $build/ctest.txt)"
fi
[ "${nccl:-OFF}" = ON ] || row "NcclComm" "not run" 0 "NCCL not found by the CMake project"

# ---- 5. Benchmark ---------------------------------------------------------------------------
timed "optim_bench_cuda $params" 180 "${exe[optim_bench_cuda]}" "$params" 20
bench_rc=$rc
bench_secs=$secs
# Its table is already in the log above; the AdamW ratio goes into ours.
line=$(grep "adamw fp32 ratio" "$log" | tail -1)
res=$(result_of "$bench_rc")
detail=${line:-no result line}
skip_verdict "$res"
row "optim_bench_cuda" "$res" "$bench_secs" "$detail"

# ---- 6. Training runs ---------------------------------------------------------------------
{
  # The README's main job on the GPU: the default config on the embedded corpus.
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  timed "train --config configs/default.json --device cuda" ${DS_GPU_TRAIN_TIMEOUT:-150} \
    mpirun -np 1 "${exe[train]}" --config "$root/configs/default.json" --device cuda --progress lines --sample_tokens 120
  res=$(result_of "$rc")
  line=$(grep '^\[train\] done:' "$log" | tail -1 | sed 's/^\[train\] //')
  vl=$(grep -o 'final validation loss [0-9.]*' "$log" | tail -1)
  row "GPU training run" "$res" "$secs" "default config, 1 GPU: ${line:-no summary} ${vl}"
  # The same job in bf16.
  timed "train --config configs/bf16.json --device cuda" ${DS_GPU_TRAIN_TIMEOUT:-150} \
    mpirun -np 1 "${exe[train]}" --config "$root/configs/bf16.json" --device cuda --progress lines --sample_tokens 0
  res=$(result_of "$rc")
  line=$(grep '^\[train\] done:' "$log" | tail -1 | sed 's/^\[train\] //')
  vl=$(grep -o 'final validation loss [0-9.]*' "$log" | tail -1)
  row "GPU training run, bf16" "$res" "$secs" "configs/bf16.json, 1 GPU: ${line:-no summary} ${vl}"
  # GPT-2 124M shape, bf16, through the Engine; then PyTorch's eager GPT-2 on the same GPU.
  if [ -x "${exe[bench_gpt_cuda]:-}" ]; then
    timed "bench_gpt_cuda (GPT-2 124M, bf16)" 150 "${exe[bench_gpt_cuda]}" --dtype bf16
    res=$(result_of "$rc")
    line=$(grep '^mfu ' "$log" | tail -1)
    tps=$(grep -A2 '^| dtype | step ms' "$log" | tail -1)
    row "bench_gpt_cuda" "$res" "$secs" "${line:-no result line} ${tps}"
    # Each layer kernel alone at the same shapes, against a device copy (DS_GPU_CHECK_QUICK=1
    # skips it and the variants below).
    if [ "${DS_GPU_CHECK_QUICK:-0}" = 1 ]; then
      row "bench_layers_cuda, variants" "not run" 0 "DS_GPU_CHECK_QUICK=1"
    elif [ -x "$build/bench/gpu/bench_layers_cuda" ]; then
      timed "bench_layers_cuda" 60 "$build/bench/gpu/bench_layers_cuda"
      row "bench_layers_cuda" "$(result_of "$rc")" "$secs" "per-kernel times at the 124M shapes: see the log"
    fi
    # Variants, for comparison: 128-row attention blocks; flash attention.
    for variant in "--attention_block 128" "--attention flash"; do
      [ "${DS_GPU_CHECK_QUICK:-0}" = 1 ] && break
      # shellcheck disable=SC2086  # the variant is two words: a flag and its value
      timed "bench_gpt_cuda (GPT-2 124M, bf16, $variant)" 150 "${exe[bench_gpt_cuda]}" --dtype bf16 --profile_steps 0 $variant
      res=$(result_of "$rc")
      line=$(grep '^mfu ' "$log" | tail -1)
      tps=$(grep -A2 '^| dtype | step ms' "$log" | tail -1)
      row "bench_gpt_cuda, $variant" "$res" "$secs" "${line:-no result line} ${tps}"
    done
  else
    row "bench_gpt_cuda" "not run" 0 "not built here"
  fi
  py=$(command -v python3 || true)
  if [ -n "$py" ] && "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    timed "PyTorch GPT-2 124M (bf16 autocast, eager)" 120 "$py" "$root/bench/gpu/torch_gpt2.py"
    line=$(grep '^torch_gpt2 ' "$log" | tail -1)
    row "torch_gpt2 (reference)" "$([ "$rc" = 0 ] && echo ok || result_of "$rc")" "$secs" "${line:-no result line}"
  else
    row "torch_gpt2 (reference)" "not run" 0 "no python3 with CUDA torch here"
  fi
}

# Table first on failure too: the run's verdict.
if [ "$failed" = 1 ]; then finish 1; fi
finish 0
