#!/usr/bin/env bash
# Activation checkpointing in the train app: the config's activation_checkpointing section (or
# --activation_checkpointing) makes the CPU GPT and Llama recompute each block in backward,
# with the same per-step losses as without (the same bits: the loss CSVs are identical), in
# fp32 and bf16 on 2 ranks; a key with no effect warns once; the MLP says it has no effect.
source "$(dirname "$0")/lib.sh"
# TINY with 3 blocks (all but the last are recomputed).
SMALL=(--n_layer 3 --n_head 2 --n_embd 32 --block_size 16 --eval_iters 2 --sample_tokens 16)

write_config ckpt.json "$CONFIGS/default.json" 'c["activation_checkpointing"] = {}'
must_run 2 plain --config "$CONFIGS/default.json" "${SMALL[@]}" --steps 4 --loss_csv plain.csv
must_run 2 ckpt --config ckpt.json "${SMALL[@]}" --steps 4 --loss_csv ckpt.csv
grep -q '^\[train\] activation checkpointing: on: activation arena .* MiB per micro-batch of 16 x 16 tokens (.* MiB without)' ckpt.out ||
  fail "gpt: no activation checkpointing line"
grep -q 'activation checkpointing' plain.out && fail "gpt: checkpointing line without the section"
cmp plain.csv ckpt.csv || fail "gpt fp32: losses differ with activation checkpointing"

write_config bf16_ckpt.json "$CONFIGS/bf16.json" 'c["activation_checkpointing"] = {"cpu_checkpointing": True}'
must_run 2 bf16 --config "$CONFIGS/bf16.json" "${SMALL[@]}" --steps 4 --loss_csv bf16.csv
must_run 2 bf16_ckpt --config bf16_ckpt.json "${SMALL[@]}" --steps 4 --loss_csv bf16_ckpt.csv
cmp bf16.csv bf16_ckpt.csv || fail "gpt bf16: losses differ with activation checkpointing"
n=$(grep -c 'activation_checkpointing.cpu_checkpointing true has no effect' bf16_ckpt.err || true)
[ "$n" = 1 ] || fail "cpu_checkpointing: expected one warning, got $n"

# The flag, on the Llama (an untied head and a tied one).
for tie in false true; do
  must_run 2 llama_$tie --config "$CONFIGS/llama_tiny.json" "${SMALL[@]}" --tie_embeddings $tie \
    --steps 4 --loss_csv llama_$tie.csv
  must_run 2 llama_${tie}_ckpt --config "$CONFIGS/llama_tiny.json" "${SMALL[@]}" --tie_embeddings $tie \
    --activation_checkpointing --steps 4 --loss_csv llama_${tie}_ckpt.csv
  grep -q '^\[train\] activation checkpointing: on' llama_${tie}_ckpt.out || fail "llama: no activation checkpointing line"
  cmp llama_$tie.csv llama_${tie}_ckpt.csv || fail "llama tie_embeddings $tie: losses differ with activation checkpointing"
done

must_run 1 mlp --config ckpt.json --model mlp --n_layer 1 --n_embd 16 --block_size 8 --eval_iters 1 --steps 2
grep -q '^\[train\] activation checkpointing: no effect on --model mlp' mlp.out || fail "mlp: no 'no effect' line"
echo "PASS"
