// LlamaCuda: the Llama-style decoder of ds/nn/llama.h on a CUDA device (built only when
// DS_HAVE_CUDA; then DS_NN_HAVE_CUDA is defined). Same parameters -- names, shapes, order,
// initialisation, ZeRO-3 groups -- as ds::nn::Llama (both take them from llama_parameters(),
// ds/nn/llama_layout.h), so checkpoints move between the CPU and the GPU model.
//
// Structured as GptCuda (ds/nn/gpt_cuda.h): Device::Cuda, the engine binds DEVICE views in the
// working dtype (fp32, fp16 or bf16) and activations are kept in it (RMSNorm rstd, log-sum-exp
// and losses in fp32); cuBLAS GEMMs with fp32 accumulation; RMSNorm, rotary embedding and
// SwiGLU are the kernels of ds/nn/cuda_llama_kernels.h, the embedding, causal softmax and
// cross-entropy those of ds/nn/cuda_kernels.h. Attention is the GPT's materialised,
// block-causal path over per-head [B, NH, T, hd] tensors; with grouped-query attention
// (n_kv_head < n_head) the kv heads are first expanded to one copy per query head
// (expand_kv_heads; their gradients summed back by reduce_kv_heads). No flash attention and no
// activation checkpointing yet.
//
// The Module side (stream, bind, groups, logits_last, generate) is CudaDecoder's
// (ds/nn/cuda_decoder.h); backward() calls grad_ready in the CPU Llama's order, with its group
// brackets: "embed", "h.0" .. "h.{n_layer-1}", "final"; a tied head acquires "embed" again.
//
// Compiled on the build machine; not yet run on a GPU (docs/dev/gpu.md).
#pragma once

#include <cstdint>

#include "ds/nn/cuda_decoder.h"
#include "ds/nn/llama_layout.h"

namespace ds::nn {

class LlamaCuda : public CudaDecoder {
 public:
  // Uses the CUDA device current at construction. allow_tf32: fp32 GEMMs may use TF32 tensor
  // cores. attention_block: query rows per block of the block-causal attention (>= 1).
  explicit LlamaCuda(const LlamaConfig& cfg, bool allow_tf32 = false, std::int64_t attention_block = 256);

  // The config with intermediate_size resolved.
  const LlamaConfig& config() const;

  struct Impl;
};

}  // namespace ds::nn
