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
// All work is enqueued on the model's own stream (device_stream()); forward() and evaluate()
// synchronise once to return the loss; backward() calls grad_ready(i) right after enqueueing
// parameter i's last gradient kernel, in the CPU Llama's order. Group brackets (GroupUse) as
// the CPU Llama: "embed", "h.0" .. "h.{n_layer-1}", "final"; a tied head acquires "embed" again.
//
// Compiled on the build machine; not yet run on a GPU (docs/dev/gpu.md).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ds/core/module.h"
#include "ds/nn/llama_layout.h"

namespace ds::nn {

class LlamaCuda : public Module {
 public:
  // Uses the CUDA device current at construction. allow_tf32: fp32 GEMMs may use TF32 tensor
  // cores. attention_block: query rows per block of the block-causal attention (>= 1).
  explicit LlamaCuda(const LlamaConfig& cfg, bool allow_tf32 = false, std::int64_t attention_block = 256);
  ~LlamaCuda() override;
  LlamaCuda(const LlamaCuda&) = delete;
  LlamaCuda& operator=(const LlamaCuda&) = delete;

  std::vector<ParamInfo> parameters() const override;
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;
  std::vector<ParamGroup> parameter_groups() const override;
  // The brackets are host calls around enqueueing a group's kernels (as GptCuda's).
  void set_group_hooks(GroupHooks* hooks) override;
  Device device() const override { return Device::Cuda; }
  void* device_stream() const override;

  // The config with intermediate_size resolved.
  const LlamaConfig& config() const;
  std::size_t num_parameters() const;
  double flops_per_token(std::int64_t seq = 0) const;  // as Llama::flops_per_token

  // As Llama::logits_last / generate (the same sampler). Overwrite the cached activations.
  std::vector<float> logits_last(std::span<const std::int32_t> context);
  std::vector<std::int32_t> generate(std::span<const std::int32_t> context, int n_new, float temperature,
                                     std::uint64_t seed);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::nn
