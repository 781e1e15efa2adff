#!/usr/bin/env bash
# Careless inputs that used to pass in silence or end a rank without a word: a working set
# larger than the machine's memory (the OOM killer), a micro-batch larger than the data (the
# data repeated every micro-step) and a csv_monitor.job_name that leaves output_path.
source "$(dirname "$0")/lib.sh"

# A micro-batch whose buffers and activations no machine holds: refused before any
# allocation, naming the key and the estimate against the memory available.
printf '{"train_micro_batch_size_per_gpu": 1000000000000}' > huge_mb.json
if run_train 2 huge_mb --config huge_mb.json "${TINY[@]}" --steps 2; then fail "huge micro-batch: exited 0"; fi
grep -q 'train: error: train_micro_batch_size_per_gpu 1000000000000: training needs about .* of host memory per rank (activations .*, micro-batch buffers .*), x 2 ranks on this machine = .*, more than the .* available (' huge_mb.err \
  || { cat huge_mb.err; fail "huge micro-batch: no error with the estimate"; }
[ "$(grep -c 'train: error: ' huge_mb.err)" = 1 ] || { cat huge_mb.err; fail "huge micro-batch: want one error line"; }
echo "ok: huge micro-batch: $(grep -o 'training needs.*available ([^)]*)' huge_mb.err)"

# A model whose states no machine holds (about 800 billion parameters): the same check.
printf '{"train_micro_batch_size_per_gpu": 1}' > mb1.json
if run_train 1 huge_model --config mb1.json --n_layer 1000 --n_head 64 --n_embd 8192 --block_size 16 --steps 1; then
  fail "huge model: exited 0"
fi
grep -q 'train: error: train_micro_batch_size_per_gpu 1: training needs about 14.7 TiB of host memory per rank (.*parameters 2.9 TiB, .*or train a smaller model' huge_model.err \
  || { cat huge_model.err; fail "huge model: no error with the estimate"; }
echo "ok: huge model refused"

# A micro-batch larger than a rank's share of the data: trains, with one warning that says so.
seq 1 1000 | head -c 3000 > small.txt  # 168 training windows of 17 tokens (the rest validates), 84 per rank
printf '{"train_micro_batch_size_per_gpu": 500}' > mb500.json
must_run 2 repeat --config mb500.json "${TINY[@]}" --data small.txt --steps 2
[ "$(grep -c 'train: warning: train_micro_batch_size_per_gpu 500 is more than the 84 training windows each rank gets (small.txt gives 168 windows' repeat.err)" = 1 ] \
  || { cat repeat.err; fail "micro-batch larger than the data: want one warning naming it"; }
grep -q 'each micro-step is a whole epoch' repeat.err || { cat repeat.err; fail "the warning does not say what happens"; }
printf '{"train_micro_batch_size_per_gpu": 8}' > mb8.json
must_run 2 fits --config mb8.json "${TINY[@]}" --data small.txt --steps 2
if grep -q 'warning' fits.err; then cat fits.err; fail "a micro-batch the data fills warned"; fi
echo "ok: micro-batch larger than the data warns"

# csv_monitor.job_name must stay inside output_path.
mkdir -p out/a/b
write_config escape.json "$CONFIGS/default.json" 'c["csv_monitor"] = {"enabled": True, "output_path": "out/a/b", "job_name": "../../x"}'
if run_train 2 escape --config escape.json "${TINY[@]}" --steps 2; then fail "csv_monitor.job_name ../../x: exited 0"; fi
grep -q 'train: error: .*csv_monitor.job_name: "../../x" is not a single directory name' escape.err \
  || { cat escape.err; fail "csv_monitor.job_name: no error naming the key"; }
[ ! -e out/x ] || fail "csv_monitor wrote outside output_path"
echo "ok: csv_monitor.job_name outside output_path refused"
echo "PASS"
