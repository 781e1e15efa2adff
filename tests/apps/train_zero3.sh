#!/usr/bin/env bash
# ZeRO stage 3 through the train app (configs/zero3.json's keys on a small GPT and Llama):
#   - the same losses as stage 0 (fp32: 1e-6 relative; bf16: 1e-4, a few bf16 ulps of the
#     parameters compound over the steps) on 2 and 4 ranks, with gradient accumulation;
#   - checkpoints move between stages and world sizes: a stage-3 save on 4 ranks resumes at
#     stage 0 on 2 ranks and at stage 2 on 1, a stage-0 save on 2 ranks resumes at stage 3 on 4,
#     each repeating the unbroken run's losses; ds_to_fp32 exports a stage-3 checkpoint;
#   - stage3_gather_16bit_weights_on_model_save writes <save_dir>/model.safetensors with the
#     final weights (bf16), equal to the exported fp32 weights rounded to bf16;
#   - the sample at the end is generated (every rank takes part in the gathers).
source "$(dirname "$0")/lib.sh"
EXPORT=$DS_BINARY_DIR/apps/ds_to_fp32/ds_to_fp32

SMALL=(--n_layer 2 --n_head 2 --n_embd 32 --block_size 16 --eval_iters 2 --sample_tokens 8)
cfg() {  # cfg OUT STAGE PRECISION GAS
  write_config "$1" "$CONFIGS/zero3.json" "
c['zero_optimization']['stage'] = $2
if $2 != 3:
    c['zero_optimization'] = {'stage': $2}
c['bf16'] = {'enabled': '$3' == 'bf16'}
c['gradient_accumulation_steps'] = $4
c['train_micro_batch_size_per_gpu'] = 4
if $2 == 3:
    c['zero_optimization']['stage3_param_persistence_threshold'] = 0
    c['zero_optimization']['stage3_prefetch_bucket_size'] = 3000
    c['zero_optimization']['stage3_max_reuse_distance'] = 0
"
}

# Same losses as stage 0 (the global batch is the same: train_batch_size fixed by micro x gas x ranks).
for prec in fp32 bf16; do
  tol=$([ $prec = fp32 ] && echo 1e-6 || echo 1e-4)
  for model in gpt llama; do
    cfg s0.json 0 $prec 2
    must_run 2 ref_${prec}_$model --config s0.json --model $model "${SMALL[@]}" --steps 6 --loss_csv ref_${prec}_$model.csv
    for np in 2 4; do
      cfg s3.json 3 $prec $((4 / np))
      must_run $np s3_${prec}_${model}_$np --config s3.json --model $model "${SMALL[@]}" --steps 6 \
        --loss_csv s3_${prec}_${model}_$np.csv
      compare_losses s3_${prec}_${model}_$np.csv ref_${prec}_$model.csv "$tol"
      grep -q '^\[train\] sample' s3_${prec}_${model}_$np.out || fail "no sample at stage 3 ($prec $model, $np ranks)"
    done
  done
done

# Checkpoints across stages and world sizes (fp32: the resumed losses repeat the unbroken run's).
cfg s3.json 3 fp32 1; cfg s0.json 0 fp32 1; cfg s2.json 2 fp32 1
must_run 4 full --config s3.json "${SMALL[@]}" --steps 8 --loss_csv full.csv
must_run 4 s3save --config s3.json "${SMALL[@]}" --steps 4 --save_dir ck3
[ -f ck3/model.safetensors ] || fail "stage3_gather_16bit_weights_on_model_save wrote no ck3/model.safetensors"
# 4 ranks at micro 4 = 16 sequences per step; 2 ranks at micro 8 and 1 rank at micro 16 keep it.
write_config s0m8.json s0.json 'c["train_micro_batch_size_per_gpu"] = 8'
write_config s2m16.json s2.json 'c["train_micro_batch_size_per_gpu"] = 16'
must_run 2 to0 --config s0m8.json "${SMALL[@]}" --steps 8 --load_dir ck3 --loss_csv to0.csv
compare_losses to0.csv full.csv 1e-6 5
must_run 1 to2 --config s2m16.json "${SMALL[@]}" --steps 8 --load_dir ck3 --loss_csv to2.csv
compare_losses to2.csv full.csv 1e-6 5
must_run 2 s0save --config s0m8.json "${SMALL[@]}" --steps 4 --save_dir ck0
must_run 4 to3 --config s3.json "${SMALL[@]}" --steps 8 --load_dir ck0 --loss_csv to3.csv
compare_losses to3.csv full.csv 1e-6 5

# Export from stage 3, and the 16-bit file against it (bf16 run).
"$EXPORT" --format safetensors ck3 s3.safetensors >/dev/null || fail "ds_to_fp32 of a stage-3 checkpoint failed"
cfg b3.json 3 bf16 1
must_run 4 b3 --config b3.json "${SMALL[@]}" --steps 3 --save_dir ckb
"$EXPORT" --format safetensors ckb b3_fp32.safetensors >/dev/null || fail "ds_to_fp32 of a bf16 stage-3 checkpoint failed"
"$PY" - ckb/model.safetensors b3_fp32.safetensors <<'PYEOF'
import json, struct, sys
import numpy as np
def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n]); head.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for k, h in head.items():
        b, e = h["data_offsets"]
        if h["dtype"] == "BF16":
            v = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16
            out[k] = (h["dtype"], v.view(np.float32).reshape(h["shape"]))
        else:
            out[k] = (h["dtype"], np.frombuffer(data[b:e], dtype="<f4").reshape(h["shape"]))
    return out
m16, m32 = read(sys.argv[1]), read(sys.argv[2])
assert set(m16) == set(m32), (sorted(m16), sorted(m32))
for k in m16:
    assert m16[k][0] == "BF16", (k, m16[k][0])
    a = m16[k][1]
    # The working weights are the fp32 master rounded to nearest even in bf16.
    x = m32[k][1].astype(np.float32).view(np.uint32)
    r = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16 << 16).view(np.float32)
    assert np.array_equal(a, r), (k, np.abs(a - r).max())
print(f"model.safetensors: {len(m16)} bf16 tensors equal to the exported master rounded to bf16")
PYEOF
echo "ok"
