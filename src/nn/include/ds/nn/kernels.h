// The CPU kernels of the built-in layers (fp32, row-major), fast versions: OpenMP-threaded,
// vectorized (AVX-512 / AVX2 clones picked at run time); GEMMs through ds/nn/gemm.h.
// Plain reference versions with the same meaning live in tests/nn/kernels_ref.h (templates, so the
// tests can run them in double precision for gradient checks).
//
// Conventions follow llm.c's train_gpt2.c: N rows (batch x seq), C channels, OC output
// channels. Forward kernels write (=) their outputs; backward kernels ACCUMULATE (+=) into
// parameter gradients, and into input gradients where the comment says so.
// Nothing here allocates: scratch comes from the caller.
#pragma once

#include <cstdint>

#include "ds/nn/gemm.h"

namespace ds::nn::kernels {

// out[N,OC] = inp[N,C] @ w[OC,C]^T + bias[OC] (+ residual[N,OC] when not null).
// bias may be null. out must not alias inp; it may alias residual.
void linear_forward(float* out, const float* inp, const float* w, const float* bias,
                    const float* residual, std::int64_t N, std::int64_t C, std::int64_t OC,
                    Precision prec = Precision::F32);
// 16-bit gradient storage a kernel may accumulate into directly (the engine's fp16 / bf16
// gradient): data null = not used.
struct HalfGrad {
  void* data = nullptr;
  bool bf16 = true;  // else fp16
};
// dw[OC,C] += dout^T @ inp (= with overwrite_dw); dbias[OC] += column sums of dout (dbias
// may be null); dinp[N,C] (=, or += when accumulate_dinp) dout @ w. dinp may be null (not
// needed). With dw_half.data (needs prec F32 and own_f32_for_layers(); not with
// overwrite_dw): dw is not used; the weight gradient is added to dw_half in fp32 and rounded
// once, as each tile is stored.
void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, std::int64_t N, std::int64_t C, std::int64_t OC,
                     bool accumulate_dinp, Precision prec = Precision::F32, HalfGrad dw_half = {},
                     bool overwrite_dw = false);

// out = (inp - mean) * rstd * w + b per row; mean/rstd[N] saved for backward.
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, std::int64_t N, std::int64_t C);
// dinp += ..., dw += ..., db += ...
void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, std::int64_t N,
                        std::int64_t C);

// GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void gelu_forward(float* out, const float* inp, std::int64_t n);
// dinp = dout * gelu'(inp) (=; dinp may alias dout).
void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n);

// Causal multi-head self-attention. qkv[B,T,3C] holds q | k | v, heads of C/NH channels.
// out[B,T,C]; att[B,NH,T,T] saves the softmax probabilities (upper triangle zero).
void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                       std::int64_t C, std::int64_t NH);
// dqkv[B,T,3C] (=) from dout[B,T,C]. scratch: scratch_slots blocks of T*T floats (one per
// thread; at most scratch_slots threads run).
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                        float* scratch, int scratch_slots);

// Token + position embedding: out[b,t,:] = wte[tok[b,t]] + wpe[t].
void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C);
// dwte[tok] += dout[b,t]; dwpe[t] += dout[b,t] (dwpe may be null: no position table).
void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C);

// Softmax cross-entropy over rows of logits[N,V]: returns the mean loss over the N rows
// and saves each row's log-sum-exp in lse[N]. Targets must lie in [0, V).
float crossentropy_forward(float* lse, const float* logits, const std::int32_t* targets,
                           std::int64_t N, std::int64_t V);
// In place: logits becomes scale/M * (softmax(logits) - onehot(target)), the gradient of
// scale * mean loss (the fused softmax + loss backward), M = mean_over, or N when 0 (a caller
// running a share of a batch's rows gives the batch's row count).
void crossentropy_backward(float* logits, const float* lse, const std::int32_t* targets,
                           std::int64_t N, std::int64_t V, float scale, std::int64_t mean_over = 0);

// a[i] += b[i]
void add_inplace(float* a, const float* b, std::int64_t n);

}  // namespace ds::nn::kernels
