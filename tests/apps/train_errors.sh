#!/usr/bin/env bash
# Bad input gets one clear `train: error:` line and a non-zero exit, and a failure on one
# rank only takes the whole job down (ctest's timeout catches a hang).
source "$(dirname "$0")/lib.sh"

# expect_error NAME PATTERN NP args...: train must fail, its stderr must have the error line
# and mention PATTERN.
expect_error() {
  local name=$1 pattern=$2 np=$3; shift 3
  if run_train "$np" "$name" "$@"; then fail "$name: exited 0"; fi
  grep -q 'train: error: ' "$name.err" || { cat "$name.err"; fail "$name: no 'train: error:' line"; }
  grep -q -- "$pattern" "$name.err" || { cat "$name.err"; fail "$name: error does not mention '$pattern'"; }
  local lines
  lines=$(grep -c 'train: error: ' "$name.err")
  echo "ok: $name ($lines error line(s)): $(grep -m1 'train: error: ' "$name.err")"
}

expect_error bad_flag '--bogus' 2 --config "$CONFIGS/default.json" --bogus 3
expect_error bad_value '--steps' 2 --config "$CONFIGS/default.json" --steps zero
expect_error no_config 'config' 1
expect_error missing_config 'nope.json' 2 --config nope.json
expect_error missing_data 'no_such_file.txt' 2 --config "$CONFIGS/default.json" "${TINY[@]}" --data no_such_file.txt
# A FIFO or a device as the config or the data file: refused at once, named as what it is
# (a FIFO used to block every rank; /dev/zero was read without end).
mkfifo data.fifo config.fifo
expect_error fifo_data 'data.fifo is a FIFO, not a regular file' 2 --config "$CONFIGS/default.json" "${TINY[@]}" --data data.fifo
expect_error fifo_config 'config.fifo is a FIFO, not a regular file' 2 --config config.fifo "${TINY[@]}"
expect_error device_data '/dev/zero is a character device, not a regular file' 1 --config "$CONFIGS/default.json" "${TINY[@]}" --data /dev/zero
expect_error steps_and_epochs 'epochs' 1 --config "$CONFIGS/default.json" --steps 3 --epochs 1
expect_error bad_heads 'n_head' 1 --config "$CONFIGS/default.json" --n_embd 30 --n_head 4
expect_error bad_model '--model' 1 --config "$CONFIGS/default.json" --model rnn
# --device cuda where no GPU is visible (every CI machine; CUDA_VISIBLE_DEVICES= hides any),
# or in a build without CUDA: one clear line either way.
CUDA_VISIBLE_DEVICES= expect_error no_gpu 'cuda' 1 --config "$CONFIGS/default.json" "${TINY[@]}" --device cuda
write_config bad_bf16_gemm.json "$CONFIGS/bf16.json" 'c["kernels"] = {"cpu_bf16_gemm": "yes"}'
expect_error bf16_gemm_key 'kernels.cpu_bf16_gemm' 2 --config bad_bf16_gemm.json "${TINY[@]}"
# A bad value of a registered DS_* variable stops the job before any work, naming it.
DS_LOG_LEVEL=loud expect_error env_check "environment variable DS_LOG_LEVEL='loud'" 2 --config "$CONFIGS/default.json" "${TINY[@]}"
[ "$(grep -c 'train: error: ' env_check.err)" = 1 ] || { cat env_check.err; fail "env_check: want one error line"; }
printf '{"train_micro_batch_size_per_gpu": 4, "gradient_clipping": "x"}' > bad_value.json
expect_error config_type 'gradient_clipping' 2 --config bad_value.json "${TINY[@]}"
printf '{"train_micro_batch_size_per_gpu": 4,, }' > bad_syntax.json
expect_error config_syntax 'bad_syntax.json' 2 --config bad_syntax.json "${TINY[@]}"
# An absurd micro-batch names the allocation that failed and the key to lower (the loader's
# buffers: 1e10 sequences of 16 tokens, 1.2 TiB), not "std::bad_alloc".
printf '{"train_micro_batch_size_per_gpu": 10000000000}' > huge_mb.json
expect_error huge_micro_batch 'micro-batch buffers' 1 --config huge_mb.json "${TINY[@]}"
grep -q 'lower train_micro_batch_size_per_gpu' huge_micro_batch.err || fail "huge_micro_batch: the key is not named"

# A flag error on rank 1 only (MPMD; CLI11 refuses a repeated --n_embd): agreed, one line.
rc=0
"$MPIEXEC" --oversubscribe --bind-to none \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 3 : \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 3 --n_embd 16 \
  >mpmd_flag.out 2>mpmd_flag.err || rc=$?
[ "$rc" != 0 ] || fail "rank-1-only flag error: mpirun exited 0"
[ "$(grep -c 'train: error: .*n_embd' mpmd_flag.err)" = 1 ] || { cat mpmd_flag.err; fail "rank-1-only flag error: expected one error line"; }
echo "ok: rank-1-only flag error: $(grep 'train: error' mpmd_flag.err)"

# Clean errors: exactly one error line for an error every rank sees.
[ "$(grep -c 'train: error: ' missing_data.err)" = 1 ] || fail "missing_data: expected one error line"
[ "$(grep -c 'train: error: ' bad_flag.err)" = 1 ] || fail "bad_flag: expected one error line"

# --help works and exits 0.
run_train 1 help --help || fail "--help exited non-zero"
grep -q -- '--deepspeed_config' help.out || fail "--help does not list --deepspeed_config"

# A failure on rank 1 only (MPMD: only rank 1 is given a missing data file): the job ends
# non-zero instead of rank 0 waiting forever.
rc=0
"$MPIEXEC" --oversubscribe --bind-to none \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 3 : \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 3 --data only_rank1_missing.txt \
  >mpmd.out 2>mpmd.err || rc=$?
[ "$rc" != 0 ] || fail "rank-1-only failure: mpirun exited 0"
grep -q 'only_rank1_missing.txt' mpmd.err || { cat mpmd.err; fail "rank-1-only failure: no error naming the file"; }
echo "ok: rank-1-only failure ended the job (rc $rc)"

# Ranks started with different model shapes: caught before the first collective.
SHAPE=(--n_layer 1 --n_head 2 --block_size 16 --eval_iters 2 --sample_tokens 16 --steps 3)
rc=0
"$MPIEXEC" --oversubscribe --bind-to none \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${SHAPE[@]}" --n_embd 32 : \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${SHAPE[@]}" --n_embd 16 \
  >mismatch.out 2>mismatch.err || rc=$?
[ "$rc" != 0 ] || fail "mismatched ranks: mpirun exited 0"
grep -q 'train: error: the ranks disagree' mismatch.err || { cat mismatch.err; fail "mismatched ranks: no clear error"; }
echo "ok: mismatched ranks refused (rc $rc)"

# A failure on rank 1 only, inside the collective phase (its --load_dir has no checkpoint
# while rank 0 loads one and goes on into training): MPI_Abort ends the whole job.
must_run 2 save --config "$CONFIGS/default.json" "${TINY[@]}" --steps 2 --save_dir ckpt
rc=0
"$MPIEXEC" --oversubscribe --bind-to none \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 6 --load_dir ckpt : \
  -np 1 "$TRAIN" --config "$CONFIGS/default.json" "${TINY[@]}" --steps 6 --load_dir no_ckpt_on_rank1 \
  >abort.out 2>abort.err || rc=$?
[ "$rc" != 0 ] || fail "rank-1 failure while training: mpirun exited 0"
grep -q 'train: error: .*no_ckpt_on_rank1' abort.err || { cat abort.err; fail "rank-1 failure while training: no error line"; }
echo "ok: rank-1 failure in the collective phase ended the job (rc $rc)"
echo "PASS"
