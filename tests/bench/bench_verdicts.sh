#!/bin/bash
# The built benchmarks at tiny sizes: each checks its result (exit 0 and a JSON: record whose
# checks all passed), fails with exit 3 and one line naming --min_ratio when the floor is out
# of reach (1000), and refuses a bad flag with exit 2. comm_bench also takes the
# communicator's tuning flags and reports them in its record. No timing is asserted.
set -uo pipefail
B=$DS_BINARY_DIR/bench
D=$(mktemp -d /tmp/ds_bench_verdicts.XXXXXX)
trap 'rm -rf "$D"' EXIT
MPI="$DS_MPIEXEC --oversubscribe --bind-to none"
fail() { echo "FAIL: $*"; exit 1; }

expect() {  # expect NAME CODE PATTERN CMD...: exit CODE, PATTERN in stderr (or stdout)
  local name=$1 code=$2 pattern=$3
  shift 3
  "$@" >"$D/out" 2>"$D/err"
  local rc=$?
  [ "$rc" = "$code" ] || { cat "$D/out" "$D/err"; fail "$name: exit $rc, expected $code"; }
  if [ -n "$pattern" ]; then
    grep -qF -- "$pattern" "$D/err" "$D/out" || { cat "$D/out" "$D/err"; fail "$name: no '$pattern'"; }
  fi
  [ "$code" != 2 ] && record_ok "$name"  # a run
  echo "ok: $name (exit $rc)"
}

record_ok() {  # record_ok NAME: the last stdout line of the run is a record whose checks passed
  local name=$1
  tail -1 "$D/out" | grep -q '^JSON: {' || fail "$name: the last line is not a JSON: record"
  tail -1 "$D/out" | sed 's/^JSON: //' | "$DS_SYSTEM_PYTHON" -c '
import json, sys
r = json.load(sys.stdin)
assert r["checks"] and all(c["ok"] for c in r["checks"]), r["checks"]
print("   record:", r["bench"], "checks", [c["detail"] for c in r["checks"]], "ratio", r["ratio"])' ||
    fail "$name: a check in the record failed"
}

# The TorchScript benchmark (`bench_verdicts.sh torch`, its own test where train has torch
# support): a tiny MLP, one round, checked against PyTorch (first loss, losses fall) at both
# layouts; a floor out of reach exits 3, a bad layout 2.
if [ "${1:-}" = torch ]; then
  tb=("$DS_SYSTEM_PYTHON" bench/torch/torch_bench.py --build "$DS_BINARY_DIR" --rounds 1 --steps 12 --batch 32
      --features 64 --hidden 128 --layers 2)
  expect "torch_bench" 0 "" "${tb[@]}"
  [ "$(grep -c '^JSON: ' "$D/out")" = 2 ] || fail "torch_bench: not one record per layout"
  expect "torch_bench --min_ratio 1000" 3 "is below --min_ratio 1000" "${tb[@]}" --layouts 2x1 --min_ratio 1000
  expect "torch_bench --layouts 3x1" 2 "--layouts: expected RANKSxTHREADS with 1 or 2 ranks, got '3x1'" \
    "${tb[@]}" --layouts 3x1
  echo "bench_verdicts torch: OK"
  exit 0
fi

# The pipeline benchmark (`bench_verdicts.sh pipe`, its own test): a tiny GPT in 2 and 4
# stages (4 ranks oversubscribe a 2-core machine, which the run must say), checked (finite
# losses, every step applied on every stage) at floor 0; a floor out of reach exits 3, a bad
# flag 2.
if [ "${1:-}" = pipe ]; then
  pb=("$B/pipe/pipe_bench" --layers 2 --embd 32 --heads 2 --seq 16 --vocab 64 --micro_batches 4 --steps 2 --warmup 1)
  for np in 2 4; do
    expect "pipe_bench -np $np" 0 "every stage applied every optimizer step" env OMP_NUM_THREADS=1 \
      $MPI -np $np "${pb[@]}" --min_ratio 0
    tail -1 "$D/out" | grep -q "\"stages\":$np," || fail "pipe_bench -np $np: the record does not say $np stages"
  done
  [ "$(nproc)" -ge 4 ] || grep -q "oversubscribe the cores" "$D/out" || fail "pipe_bench -np 4: no oversubscription note"
  expect "pipe_bench --min_ratio 1000" 3 "is below --min_ratio 1000" $MPI -np 2 "${pb[@]}" --min_ratio 1000
  expect "pipe_bench --micro_batches 0" 2 "--micro_batches" "$B/pipe/pipe_bench" --micro_batches 0
  echo "bench_verdicts pipe: OK"
  exit 0
fi

comm=(--min_size 4K --max_size 64K --warmup 0 --budget 0.001)
expect "comm_bench" 0 "" $MPI -np 2 "$B/comm/comm_bench" "${comm[@]}"
expect "comm_bench --min_ratio 1000" 3 "is below --min_ratio 1000" $MPI -np 2 "$B/comm/comm_bench" "${comm[@]}" --min_ratio 1000
expect "comm_bench tuning flags" 0 "" $MPI -np 2 "$B/comm/comm_bench" "${comm[@]}" --shm_chunk 256K \
  --shm_oneshot_max 0 --plain_all_reduce 8K:max --plain_all_gather none --barrier_spins 16 --no_progress_thread
tail -1 "$D/out" | grep -q '"shm_chunk_bytes":262144' || fail "comm_bench: --shm_chunk not in the record"
tail -1 "$D/out" | grep -q '"plain_all_reduce":"8K:max"' || fail "comm_bench: --plain_all_reduce not in the record"
tail -1 "$D/out" | grep -q '"shm_oneshot_max":0' || fail "comm_bench: --shm_oneshot_max not in the record"
tail -1 "$D/out" | grep -q '"progress_thread":false' || fail "comm_bench: --no_progress_thread not in the record"
expect "comm_bench --no_shm" 0 "shm off" $MPI -np 2 "$B/comm/comm_bench" "${comm[@]}" --no_shm
expect "comm_bench --shm_chunk 1X" 2 "--shm_chunk: expected bytes with an optional K/M/G suffix, got '1X'" \
  "$B/comm/comm_bench" --shm_chunk 1X
expect "comm_bench --plain_all_reduce 5" 2 "expected FROM:BELOW" "$B/comm/comm_bench" --plain_all_reduce 5

expect "optim_bench" 0 "fast optimizer kernels equal the reference" "$B/optim/optim_bench" --sizes 20000 --threads 1 --repeats 1 --only sgd
expect "optim_bench --min_ratio 1000" 3 "is below --min_ratio 1000" "$B/optim/optim_bench" --sizes 20000 --threads 1 --repeats 1 --only adamw --min_ratio 1000
expect "optim_bench --min_ratio x" 2 "optim_bench: error: --min_ratio: expected a number >= 0, got 'x'" "$B/optim/optim_bench" --min_ratio x

expect "bench_checkpoint" 0 "every load equals the saved" "$B/checkpoint/bench_checkpoint" "$D/ckpt" 100000 2 --dd
expect "bench_checkpoint --min_ratio 1000" 3 "is below --min_ratio 1000" "$B/checkpoint/bench_checkpoint" "$D/ckpt" 100000 1 --dd --min_ratio 1000
expect "bench_checkpoint --min_ratio without --dd" 2 "--min_ratio compares against dd: add --dd" "$B/checkpoint/bench_checkpoint" "$D/ckpt" 1000 1 --min_ratio 1

aio=(--dir "$D" --bytes 3000000 --chunk 1000000 --block_size 65536 --queue_depth 2 --repeats 1)
expect "bench_aio" 0 "" "$B/aio/bench_aio" "${aio[@]}" --dd_write_gbs 1 --dd_read_gbs 1
expect "bench_aio --min_ratio 1000" 3 "is below --min_ratio 1000" "$B/aio/bench_aio" "${aio[@]}" --dd_write_gbs 1 --dd_read_gbs 1 --min_ratio 1000
expect "bench_aio --min_ratio without dd" 2 "--min_ratio compares against dd: add --dd_write_gbs and --dd_read_gbs" "$B/aio/bench_aio" "${aio[@]}" --min_ratio 1
expect "bench_aio --queue_depth 0" 2 "must be positive" "$B/aio/bench_aio" --queue_depth 0

expect "page_release_bench" 0 "released pages hold what was written" "$B/zero/page_release_bench" --mib 1 --bucket-mib 0.25 --reps 1
expect "page_release_bench --min_ratio 1000" 3 "is below --min_ratio 1000" "$B/zero/page_release_bench" --mib 1 --bucket-mib 0.25 --reps 1 --min_ratio 1000
expect "page_release_bench --reps 0" 2 "--reps" "$B/zero/page_release_bench" --reps 0

# The training benchmarks, GPT and Llama, at a tiny shape.
train=(--steps 3 --warmup 1 --layers 1 --embd 64 --seq 16 --batch 4)
for m in gpt llama; do
  expect "bench_train --model $m" 0 "the loss is finite and falls" env OMP_NUM_THREADS=1 "$B/train/bench_train" --model $m "${train[@]}"
done
expect "bench_train --model llama --min_ratio 1000" 3 "is below --min_ratio 1000" env OMP_NUM_THREADS=1 \
  "$B/train/bench_train" --model llama "${train[@]}" --min_ratio 1000
expect "bench_train --model x" 2 "bench_train: error: --model x: expected gpt or llama" "$B/train/bench_train" --model x
if [ -x "$B/train/bench_train_engine" ]; then  # built with the engine
  expect "bench_train_engine --model llama" 0 "every rank holds the same parameters" env OMP_NUM_THREADS=1 \
    $MPI -np 2 "$B/train/bench_train_engine" --model llama --steps 3 --warmup 1 --layers 1 --embd 64 --batch 2
  expect "bench_train_engine --model x" 2 "bench_train_engine: error: --model x: expected gpt or llama" \
    "$B/train/bench_train_engine" --model x
fi

if [ -x "$B/zero/zero_bench" ]; then  # built with the engine
  zero=(--steps 1 --warmup 0 --layers 1 --embd 64 --seq 16 --batch 1)
  expect "zero_bench --stage 2" 0 "the final parameters equal stage 0's" $MPI -np 2 "$B/zero/zero_bench" --stage 2 "${zero[@]}"
  expect "zero_bench --stage 1 --min_ratio 1000" 3 "is below --min_ratio 1000" $MPI -np 2 "$B/zero/zero_bench" --stage 1 "${zero[@]}" --min_ratio 1000
  expect "zero_bench --stage x" 2 "--stage" "$B/zero/zero_bench" --stage x
fi
# The GPU benchmarks (built with CUDA): a bad flag exits 2 on any machine; without a GPU a
# run exits 77 after one line; with one, it checks its result and honours --min_ratio.
gpu_run() {  # gpu_run NAME CMD...: 77 and the skip line without a GPU, else a passing run
  local name=$1
  shift
  "$@" >"$D/out" 2>"$D/err"
  local rc=$?
  if [ "$rc" = 77 ]; then
    [ "$(wc -l <"$D/out")" = 1 ] && grep -q "no CUDA device visible" "$D/out" ||
      { cat "$D/out" "$D/err"; fail "$name: exit 77 without the one skip line"; }
    echo "ok: $name (exit 77: no GPU)"
    return 1
  fi
  [ "$rc" = 0 ] || { cat "$D/out" "$D/err"; fail "$name: exit $rc, expected 0 (or 77 without a GPU)"; }
  record_ok "$name"
  echo "ok: $name (exit 0)"
}
if [ -x "$B/optim/optim_bench_cuda" ]; then
  expect "optim_bench_cuda --min_ratio x" 2 "optim_bench_cuda: error: --min_ratio: expected a number >= 0, got 'x'" \
    "$B/optim/optim_bench_cuda" --min_ratio x
  expect "optim_bench_cuda 12x" 2 "optim_bench_cuda: error: params: expected a positive integer, got '12x'" \
    "$B/optim/optim_bench_cuda" 12x
  if gpu_run "optim_bench_cuda 100003 2" "$B/optim/optim_bench_cuda" 100003 2; then
    expect "optim_bench_cuda --min_ratio 1000" 3 "is below --min_ratio 1000" "$B/optim/optim_bench_cuda" 100003 2 --min_ratio 1000
  fi
fi
if [ -x "$B/gpu/bench_layers_cuda" ]; then
  expect "bench_layers_cuda --bogus" 2 "bench_layers_cuda: error: unknown argument '--bogus'" "$B/gpu/bench_layers_cuda" --bogus
  expect "bench_layers_cuda --min_ratio" 2 "bench_layers_cuda: error: a value is needed after '--min_ratio'" \
    "$B/gpu/bench_layers_cuda" --min_ratio
  gpu_run "bench_layers_cuda" "$B/gpu/bench_layers_cuda"
fi
echo "bench_verdicts: OK"
