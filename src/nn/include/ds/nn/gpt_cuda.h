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
// The Module side, the stream, logits_last and generate are CudaDecoder's (ds/nn/cuda_decoder.h).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ds/nn/cuda_decoder.h"
#include "ds/nn/gpt.h"
#include "ds/nn/op_profile.h"

namespace ds::nn {

// How GptCuda computes attention (the train app sets it from the config's kernels section).
struct GptCudaAttention {
  bool flash = false;         // flash kernels where the dtype and head size allow, else materialised
  std::int64_t block = 256;   // query rows per block of the materialised path (>= 1)
};

class GptCuda : public CudaDecoder {
 public:
  // Uses the CUDA device current at construction (the caller picks it, e.g. from the local
  // rank). allow_tf32: fp32 GEMMs may use TF32 tensor cores (off: exact fp32 GEMMs).
  explicit GptCuda(const GptConfig& cfg, bool allow_tf32 = false, const GptCudaAttention& attention = {});

  const GptConfig& config() const;

  // Per-op device time (benchmarks, op_profile.h): when on, every op of forward/backward is
  // bracketed by CUDA events; profile() synchronises and returns the accumulated device time
  // per op (wall_s; cpu_s and flops stay 0).
  using OpTime = ds::nn::OpTime;
  void set_profiling(bool on);
  std::vector<OpTime> profile();

  struct Impl;

 private:
  Impl& impl();
};

}  // namespace ds::nn
