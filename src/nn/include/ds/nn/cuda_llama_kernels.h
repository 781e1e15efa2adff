// CUDA kernels of the Llama-style decoder (src/nn/src/cuda/layers_llama.cu; built only when
// DS_HAVE_CUDA, and then DS_NN_HAVE_CUDA is defined). The same meaning as the CPU kernels of
// ds/nn/llama_kernels.h (tests/cuda/test_cuda_llama_kernels.cpp compares them), with the
// conventions of ds/nn/cuda_kernels.h: DEVICE pointers, enqueued on `stream`, never a host
// sync; `dt` (fp32, fp16 or bf16) is the element type of every `void*` tensor, `float*`
// tensors are fp32; arithmetic in fp32, each output rounded to dt once; backward kernels
// accumulate (+=) into parameter gradients.
//
// Compiled on the build machine; not yet run on a GPU (docs/dev/gpu.md).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds/core/dtype.h"

namespace ds::nn::cuda {

// RMSNorm as HF's LlamaRMSNorm: out = w * (x * rstd), rstd = 1 / sqrt(mean(x^2) + eps) per
// row; rstd[N] (fp32) saved for backward. One warp per row.
void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, std::int64_t N, std::int64_t C,
                     float eps, DType dt, cudaStream_t stream);
// dinp += rstd * (w dy - x rstd^2 mean(w dy x)); dw += sum over rows of dy x rstd (column
// partials over chunks of rows into scratch, reduced in a fixed order: deterministic).
// scratch: rmsnorm_scratch_floats(N, C) floats (only read when dw is non-null).
void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const float* rstd,
                      std::int64_t N, std::int64_t C, float* scratch, DType dt, cudaStream_t stream);
std::size_t rmsnorm_scratch_floats(std::int64_t N, std::int64_t C);

// Rotary embedding in place over x[N, ld] (row r at position r % T): each of n_heads heads of
// hd channels at column h * hd is rotated in HF's rotate_half convention, (x1, x2) -> (x1 cos
// - x2 sin, x2 cos + x1 sin) with x1 / x2 the head's first / second half. cos, sin: the fp32
// tables of kernels::rope_tables, [T_max, hd / 2] on the device (T <= T_max).
void rope_forward(void* x, std::int64_t N, std::int64_t T, std::int64_t ld, std::int64_t n_heads, std::int64_t hd,
                  const float* cos, const float* sin, DType dt, cudaStream_t stream);
// In place: the gradient through the rotation (the rotation by -angle).
void rope_backward(void* dx, std::int64_t N, std::int64_t T, std::int64_t ld, std::int64_t n_heads,
                   std::int64_t hd, const float* cos, const float* sin, DType dt, cudaStream_t stream);

// SwiGLU: out = silu(gate) * up over n elements; backward writes (=) dgate and dup.
void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n, DType dt, cudaStream_t stream);
void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, std::int64_t n,
                     DType dt, cudaStream_t stream);

// Grouped-query attention through the GPT's per-head attention: the kv heads repeated for
// their query heads. x[B,T,NKV*hd] -> yh[B,NH,T,hd] (=), query head h reading kv head
// h / (NH / NKV) (NKV == NH: split_heads).
void expand_kv_heads(void* yh, const void* x, std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                     std::int64_t hd, DType dt, cudaStream_t stream);
// Its gradient: dx[B,T,NKV*hd] (=) = the sum over each kv head's query heads of dyh[B,NH,T,hd]
// (in fp32, in head order, rounded once).
void reduce_kv_heads(void* dx, const void* dyh, std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                     std::int64_t hd, DType dt, cudaStream_t stream);

}  // namespace ds::nn::cuda
