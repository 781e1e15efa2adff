// GptCuda: the GPT-2 style decoder of ds/nn/gpt.h on a CUDA device (built only when
// DS_HAVE_CUDA; then DS_NN_HAVE_CUDA is defined). Same parameters -- names, shapes, order,
// initialisation -- as ds::nn::Gpt, so checkpoints move between the CPU and the GPU model.
//
// It implements ds::Module with device() == Device::Cuda: the engine binds DEVICE views in
// the working dtype (fp32, fp16 or bf16) and the model keeps its activations in that dtype
// too (LayerNorm statistics, log-sum-exp and losses in fp32). GEMMs run on cuBLAS
// (cublasGemmEx / strided-batched, fp32 accumulation; tensor cores for fp16 / bf16, and
// TF32 for fp32 only when allow_tf32 is set); LayerNorm, GELU, the causal softmax, the
// embedding and the fused softmax + cross-entropy are the kernels of ds/nn/cuda_kernels.h.
// Attention materialises the [B, NH, T, T] probabilities (saved for backward), block-causal:
// 256-row query blocks (GptCudaAttention::block, config kernels.attention_block) multiply only
// the keys they see. With GptCudaAttention::flash (kernels.attention "flash"), fp16 / bf16
// models whose head size ds/nn/cuda_flash.h supports use flash attention instead (no T x T
// tensor; slower at GPT-2 124M on an H200, docs/dev/gpu.md).
//
// All work is enqueued on the model's own stream (device_stream()); forward() and
// evaluate() synchronise once to return the loss. backward() calls grad_ready(i) right
// after enqueueing parameter i's last gradient kernel (not waiting for it).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ds/core/module.h"
#include "ds/nn/gpt.h"
#include "ds/nn/op_profile.h"

namespace ds::nn {

// How GptCuda computes attention (the train app sets it from the config's kernels section).
struct GptCudaAttention {
  bool flash = false;         // flash kernels where the dtype and head size allow, else materialised
  std::int64_t block = 256;   // query rows per block of the materialised path (>= 1)
};

class GptCuda : public Module {
 public:
  // Uses the CUDA device current at construction (the caller picks it, e.g. from the local
  // rank). allow_tf32: fp32 GEMMs may use TF32 tensor cores (off: exact fp32 GEMMs).
  explicit GptCuda(const GptConfig& cfg, bool allow_tf32 = false, const GptCudaAttention& attention = {});
  ~GptCuda() override;
  GptCuda(const GptCuda&) = delete;
  GptCuda& operator=(const GptCuda&) = delete;

  std::vector<ParamInfo> parameters() const override;
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;
  // ZeRO-3: Gpt's groups ("embed", "h.0" .., "final"; the tied head acquires "embed" again).
  // The brackets are host calls around enqueueing a group's kernels (release() comes before
  // they have run on device_stream()).
  std::vector<ParamGroup> parameter_groups() const override;
  void set_group_hooks(GroupHooks* hooks) override;
  Device device() const override { return Device::Cuda; }
  void* device_stream() const override;

  const GptConfig& config() const;
  std::size_t num_parameters() const;
  // Same FLOP count as Gpt::flops_per_token (for MFU).
  double flops_per_token(std::int64_t seq = 0) const;

  // Logits of the token after `context` (last block_size tokens), copied to the host; and
  // sampling as Gpt::generate (same RNG and inverse-CDF sampler, so the same logits give
  // the same tokens). Overwrite the cached activations: call outside forward/backward.
  std::vector<float> logits_last(std::span<const std::int32_t> context);
  std::vector<std::int32_t> generate(std::span<const std::int32_t> context, int n_new,
                                     float temperature, std::uint64_t seed);

  // Per-op device time (benchmarks, op_profile.h): when on, every op of forward/backward is
  // bracketed by CUDA events; profile() synchronises and returns the accumulated device time
  // per op (wall_s; cpu_s and flops stay 0).
  using OpTime = ds::nn::OpTime;
  void set_profiling(bool on);
  std::vector<OpTime> profile();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::nn
