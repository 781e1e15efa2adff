#!/usr/bin/env bash
# Gradient accumulation matches one big micro-batch with the same global batch: on 2 ranks,
# micro-batch 4 x 1 step vs micro-batch 2 x 2 accumulation steps (global batch 8 both), and
# the grad_accum.json example against default.json's global batch. Tolerance 1e-4 relative
# (the same samples; only float summation order differs).
source "$(dirname "$0")/lib.sh"

write_config mb4.json "$CONFIGS/default.json" '
c["train_micro_batch_size_per_gpu"] = 4; c["gradient_accumulation_steps"] = 1'
write_config mb2x2.json "$CONFIGS/default.json" '
c["train_micro_batch_size_per_gpu"] = 2; c["gradient_accumulation_steps"] = 2'
must_run 2 mb4 --config mb4.json "${TINY[@]}" --steps 8 --loss_csv mb4.csv
must_run 2 mb2x2 --config mb2x2.json "${TINY[@]}" --steps 8 --loss_csv mb2x2.csv
compare_losses mb4.csv mb2x2.csv 1e-4

# The shipped example: grad_accum.json has the same global batch as default.json.
"$PY" - "$CONFIGS/default.json" "$CONFIGS/grad_accum.json" <<'PYEOF'
import json, sys
d, g = (json.load(open(p)) for p in sys.argv[1:3])
tb = lambda c: c["train_micro_batch_size_per_gpu"] * c.get("gradient_accumulation_steps", 1)
assert tb(d) == tb(g), f"grad_accum.json per-rank batch {tb(g)} != default.json {tb(d)}"
assert g.get("gradient_accumulation_steps", 1) > 1
PYEOF
must_run 2 def --config "$CONFIGS/default.json" "${TINY[@]}" --steps 4 --loss_csv def.csv
must_run 2 ga --config "$CONFIGS/grad_accum.json" "${TINY[@]}" --steps 4 --loss_csv ga.csv
compare_losses def.csv ga.csv 1e-4
echo "PASS"
