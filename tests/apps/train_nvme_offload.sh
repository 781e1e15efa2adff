#!/usr/bin/env bash
# NVMe offload through the train app (configs/zero3_nvme.json: offload_optimizer and
# offload_param on "nvme" at stage 3):
#   - the same losses as the run in memory, exactly (bf16, 2 ranks; several sub-groups);
#   - the swap files are scratch: none left after a run; after a run killed with SIGKILL its
#     swap directories are left, and the next run removes them (one line each) before training;
#   - checkpoints move across offload settings: saved with NVMe offload, resumed in memory, and
#     the other way round, each repeating the unbroken run's losses;
#   - stage3_gather_16bit_weights_on_model_save writes the same model.safetensors as in memory;
#   - a missing nvme_path is one clear error naming the key, before the first step.
source "$(dirname "$0")/lib.sh"

SMALL=(--n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --eval_iters 2 --sample_tokens 8)
mkdir nvme
cfg() {  # cfg OUT OFFLOAD(True|False) [NVME_PATH]
  write_config "$1" "$CONFIGS/zero3_nvme.json" "
z = c['zero_optimization']
z['stage3_param_persistence_threshold'] = 0
z['stage3_prefetch_bucket_size'] = 3000
z['stage3_max_reuse_distance'] = 0
c['train_micro_batch_size_per_gpu'] = 4
c['steps_per_print'] = 1
z['stage3_gather_16bit_weights_on_model_save'] = True
if $2:
    z['offload_optimizer']['nvme_path'] = z['offload_param']['nvme_path'] = '${3:-$WORK/nvme}'
    z['sub_group_size'] = 4096
else:
    del z['offload_optimizer'], z['offload_param'], z['sub_group_size'], c['aio']
"
}
swap_dirs() { find nvme -mindepth 2 -maxdepth 2 -type d 2>/dev/null | wc -l; }

cfg mem.json False
cfg off.json True
must_run 2 mem --config mem.json "${SMALL[@]}" --steps 8 --loss_csv mem.csv
must_run 2 off --config off.json "${SMALL[@]}" --steps 8 --loss_csv off.csv
compare_losses off.csv mem.csv 0
grep -q 'on NVMe' off.out off.err || fail "the model-state line does not show the bytes on NVMe"
[ "$(swap_dirs)" = 0 ] || fail "swap directories left after a finished run: $(find nvme)"

# Killed: the swap directories stay; the next run removes them first.
cfg crash.json True
"$MPIEXEC" --oversubscribe --bind-to none -np 2 "$TRAIN" --config crash.json "${SMALL[@]}" --steps 100000 \
  >crash.out 2>crash.err &
mpirun_pid=$!
for _ in $(seq 200); do
  grep -q '^\[rank 0\].*step' crash.out crash.err 2>/dev/null && [ "$(swap_dirs)" = 2 ] && break
  sleep 0.1
done
[ "$(swap_dirs)" = 2 ] || fail "the killed run never made its two swap directories: $(find nvme)"
pkill -KILL -f "$TRAIN --config crash.json" || true
wait $mpirun_pid 2>/dev/null || true
[ "$(swap_dirs)" = 2 ] || fail "expected the killed run's swap directories to be left: $(find nvme)"
must_run 2 after --config off.json "${SMALL[@]}" --steps 2
n=$(grep -c 'removed stale swap directory' after.err after.out | awk -F: '{s += $2} END {print s}')
[ "$n" -ge 2 ] || fail "the next run did not report removing the two stale swap directories ($n)"
[ "$(swap_dirs)" = 0 ] || fail "swap directories left after the cleaning run: $(find nvme)"

# Checkpoints across offload settings (the unbroken run: mem.csv).
must_run 2 s_off --config off.json "${SMALL[@]}" --steps 4 --save_dir ck_off
must_run 2 r_mem --config mem.json "${SMALL[@]}" --steps 8 --load_dir ck_off --loss_csv r_mem.csv
compare_losses r_mem.csv mem.csv 0 5
must_run 2 s_mem --config mem.json "${SMALL[@]}" --steps 4 --save_dir ck_mem
must_run 2 r_off --config off.json "${SMALL[@]}" --steps 8 --load_dir ck_mem --loss_csv r_off.csv
compare_losses r_off.csv mem.csv 0 5
grep -rq 'dstrain-swap' ck_off ck_mem && fail "a checkpoint names the swap files"
# save_16bit_model gathers the parameter pieces from the swap file: the same bytes as in memory.
cmp ck_off/model.safetensors ck_mem/model.safetensors || fail "model.safetensors differs with offload_param nvme"

# A missing nvme_path: one line naming the key, non-zero exit, before any step.
cfg bad.json True /nonexistent/nvme
if run_train 2 bad --config bad.json "${SMALL[@]}" --steps 2; then fail "a missing nvme_path trained"; fi
grep -q 'offload_optimizer.nvme_path /nonexistent/nvme' bad.err || { cat bad.err; fail "no error naming the key"; }
grep -q 'step' bad.out && grep -q '^\[rank 0\] step' bad.out && fail "steps ran with a missing nvme_path"
echo PASS
