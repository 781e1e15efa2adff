#!/usr/bin/env bash
# Same global batch on 1, 2 and 4 ranks (train_batch_size only: micro-batch = 8 / world size)
# gives the same loss curve. The samples of a global step are the same set (the
# DistributedSampler strides one seeded permutation across ranks); what differs is only the
# order of float sums in the gradient average, so the curves agree to 1e-4 relative.
source "$(dirname "$0")/lib.sh"

write_config tb8.json "$CONFIGS/default.json" '
del c["train_micro_batch_size_per_gpu"]; del c["gradient_accumulation_steps"]
c["train_batch_size"] = 8'
must_run 1 np1 --config tb8.json "${TINY[@]}" --steps 8 --loss_csv np1.csv
must_run 2 np2 --config tb8.json "${TINY[@]}" --steps 8 --loss_csv np2.csv
compare_losses np1.csv np2.csv 1e-4
must_run 4 np4 --config tb8.json "${TINY[@]}" --steps 8 --loss_csv np4.csv
compare_losses np1.csv np4.csv 1e-4
echo "PASS"
