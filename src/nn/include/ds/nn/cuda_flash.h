// Causal flash attention (FlashAttention-2 style) for the GPU GPT: forward and backward
// without a T x T matrix in global memory (src/nn/src/cuda/flash_attention.cu; built only
// when DS_HAVE_CUDA, and then DS_NN_HAVE_CUDA is defined).
//
// Conventions (as ds/nn/cuda_kernels.h): DEVICE pointers, every function enqueues on
// `stream` and never synchronises the host; arithmetic and accumulation are fp32 (tensor-core
// products of dt operands), each output element is rounded to dt once. The dt pointers must
// be 16-byte aligned (hs is a multiple of 8, so every row then is too).
//
// Determinism: o, lse, dk and dv are bitwise reproducible run to run; dq is summed over the
// key blocks with fp32 atomicAdd, so its last bits may depend on the order the blocks finish.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds/core/dtype.h"

namespace ds::nn::cuda {

// Causal scaled-dot-product attention on the per-head layout of split_qkv: q, k, v, o, do,
// dq, dk, dv are [BNH, T, hs] contiguous in dt (F16 or BF16), lse is [BNH*T] fp32.
// o[i] = sum_{j<=i} softmax_j(scale * q_i.k_j) v_j ; lse[i] = log sum_{j<=i} exp(scale*q_i.k_j).
bool flash_attention_supported(DType dt, std::int64_t hs);   // F16/BF16 and hs in {32, 64, 128}
void flash_attention_forward(void* o, float* lse, const void* q, const void* k, const void* v,
                             std::int64_t BNH, std::int64_t T, std::int64_t hs, float scale,
                             DType dt, cudaStream_t stream);
// dq, dk, dv written (=). scratch: flash_backward_scratch_floats(BNH, T, hs) floats (D =
// rowsum(do*o) and an fp32 dq accumulator); the function initialises what it needs.
std::size_t flash_backward_scratch_floats(std::int64_t BNH, std::int64_t T, std::int64_t hs);
void flash_attention_backward(void* dq, void* dk, void* dv, const void* q, const void* k,
                              const void* v, const void* o, const void* dout, const float* lse,
                              float* scratch, std::int64_t BNH, std::int64_t T, std::int64_t hs,
                              float scale, DType dt, cudaStream_t stream);

}  // namespace ds::nn::cuda
