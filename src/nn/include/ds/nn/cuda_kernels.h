// CUDA kernels of the built-in layers (src/nn/src/cuda/*.cu; built only when DS_HAVE_CUDA,
// and then DS_NN_HAVE_CUDA is defined). The same meaning as the CPU kernels of
// ds/nn/kernels.h and the plain references of tests/nn/kernels_ref.h; the GEMMs are not here
// (GptCuda calls cuBLAS directly).
//
// Conventions:
// - DEVICE pointers; every function enqueues on `stream` and never synchronises the host.
// - `dt` is the element type of every `void*` tensor (activations, parameters, their
//   gradients): F32, F16 or BF16, the engine's working dtype. `float*` tensors are fp32
//   always (LayerNorm mean/rstd, log-sum-exp, per-row losses, scratch).
// - Arithmetic is fp32; each output element is rounded to dt once.
// - Forward kernels write (=) their outputs. Backward kernels ACCUMULATE (+=) into parameter
//   gradients (the engine zeroes them after each optimizer step) and into the input gradients
//   where the comment says "+=".
// - N = rows (batch x seq), C channels, OC output channels, V vocabulary, NH heads,
//   hs = C / NH head size.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds/core/dtype.h"

namespace ds::nn::cuda {

// out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]
void embedding_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C, DType dt, cudaStream_t stream);
// dwte[tok[b,t],:] += dout[b,t,:] ; dwpe[t,:] += sum_b dout[b,t,:].
// scratch: V*C floats the function zeroes and uses to sum the rows of dwte in fp32 before
// one rounded add into dwte (V = rows of wte).
void embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t V,
                        float* scratch, DType dt, cudaStream_t stream);

// out = (inp - mean) * rstd * w + b per row (eps 1e-5, biased variance); mean/rstd saved.
void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w,
                       const void* b, std::int64_t N, std::int64_t C, DType dt, cudaStream_t stream);
// dinp += ..., dw += ..., db += ... . scratch: layernorm_scratch_floats(N, C) floats.
void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp,
                        const void* w, const float* mean, const float* rstd, std::int64_t N,
                        std::int64_t C, float* scratch, DType dt, cudaStream_t stream);
std::size_t layernorm_scratch_floats(std::int64_t N, std::int64_t C);

// out[n,o] += bias[o] (bias may be null) and += residual[n,o] (residual may be null; it may
// alias nothing else). The GEMM writes out first.
void add_bias_residual(void* out, const void* bias, const void* residual, std::int64_t N,
                       std::int64_t OC, DType dt, cudaStream_t stream);
// dbias[o] += sum_n dout[n,o]. scratch: bias_scratch_floats(N, OC) floats.
void bias_backward(void* dbias, const void* dout, std::int64_t N, std::int64_t OC, float* scratch,
                   DType dt, cudaStream_t stream);
std::size_t bias_scratch_floats(std::int64_t N, std::int64_t OC);

// GPT-2's tanh GELU. gelu_backward: dinp = dout * gelu'(inp) (=; dinp may alias dout).
void gelu_forward(void* out, const void* inp, std::int64_t n, DType dt, cudaStream_t stream);
void gelu_backward(void* dinp, const void* inp, const void* dout, std::int64_t n, DType dt,
                   cudaStream_t stream);

// Attention layout helpers. qkv[B,T,3C] holds q | k | v; each head h of q is channels
// [h*hs, (h+1)*hs) of the q part. The per-head tensors are [B,NH,T,hs] (contiguous).
void split_qkv(void* q, void* k, void* v, const void* qkv, std::int64_t B, std::int64_t T,
               std::int64_t C, std::int64_t NH, DType dt, cudaStream_t stream);
// Inverse of split_qkv (=): dqkv[B,T,3C] from dq, dk, dv [B,NH,T,hs].
void merge_qkv(void* dqkv, const void* dq, const void* dk, const void* dv, std::int64_t B,
               std::int64_t T, std::int64_t C, std::int64_t NH, DType dt, cudaStream_t stream);
// y[B,T,C] (=) from yh[B,NH,T,hs]; and the inverse, yh from y.
void merge_heads(void* y, const void* yh, std::int64_t B, std::int64_t T, std::int64_t C,
                 std::int64_t NH, DType dt, cudaStream_t stream);
void split_heads(void* yh, const void* y, std::int64_t B, std::int64_t T, std::int64_t C,
                 std::int64_t NH, DType dt, cudaStream_t stream);

// Causal softmax over rows of BNH blocks of [T,T] scores: att[i,j] = softmax_j(scale *
// scores[i,j]) over j <= i, and 0 for j > i (whatever scores holds there). att may alias
// scores.
void causal_softmax_forward(void* att, const void* scores, float scale, std::int64_t BNH,
                            std::int64_t T, DType dt, cudaStream_t stream);
// dscores[i,j] = scale * att[i,j] * (datt[i,j] - sum_k att[i,k] datt[i,k]) for j <= i, 0 for
// j > i (=). dscores may alias datt.
void causal_softmax_backward(void* dscores, const void* att, const void* datt, float scale,
                             std::int64_t BNH, std::int64_t T, DType dt, cudaStream_t stream);

// Softmax cross-entropy over rows of logits[N,V] (row stride V): losses[n] = lse[n] -
// logits[n, targets[n]], lse[n] saved. Targets must lie in [0, V) (not checked on the device).
void crossentropy_forward(float* losses, float* lse, const void* logits,
                          const std::int32_t* targets, std::int64_t N, std::int64_t V, DType dt,
                          cudaStream_t stream);
// In place: logits becomes scale/N * (softmax(logits) - onehot(target)).
void crossentropy_backward(void* logits, const float* lse, const std::int32_t* targets,
                           std::int64_t N, std::int64_t V, float scale, DType dt,
                           cudaStream_t stream);
// *out = mean of x[0..n) (one block, fp32 sum in a fixed order: deterministic).
void mean(float* out, const float* x, std::int64_t n, cudaStream_t stream);

// Element conversions: dst (dt_dst) = src (dt_src), n elements (fp32 <-> fp16/bf16, RNE).
void convert(void* dst, DType dt_dst, const void* src, DType dt_src, std::int64_t n,
             cudaStream_t stream);

}  // namespace ds::nn::cuda
