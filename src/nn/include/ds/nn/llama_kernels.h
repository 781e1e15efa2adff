// CPU kernels of the Llama-style decoder (fp32, row-major; conventions of ds/nn/kernels.h:
// forward kernels write (=), backward kernels accumulate (+=) into parameter gradients and
// write or accumulate input gradients as each comment says). The Linear layers, embedding and
// cross-entropy are the GPT's (kernels.h). Plain reference versions with the same meaning:
// tests/nn/llama_ref.h.
#pragma once

#include <cstdint>

namespace ds::nn::kernels {

// RMSNorm as HF's LlamaRMSNorm: out = w * x * rstd, rstd = 1 / sqrt(mean(x^2) + eps), per row;
// rstd[N] saved for backward.
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                     std::int64_t C, float eps);
// dinp += ..., dw += ... (rows split among the threads; each thread's dw sum is kept apart in
// a small allocation of threads x C floats and added in thread order: the same bits for a
// given thread count).
void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, std::int64_t N, std::int64_t C);

// Rotary tables: cos/sin[t * hd/2 + i] = cos/sin(t * theta^(-2i/hd)), t < T, i < hd/2.
void rope_tables(float* cos, float* sin, std::int64_t T, std::int64_t hd, double theta);
// In place over x[N, ld] (row r at position r % T): each of n_heads heads of hd channels at
// column h * hd is rotated in HF's rotate_half convention, x1 = first half, x2 = second half:
// (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin).
void rope_forward(float* x, std::int64_t N, std::int64_t T, std::int64_t ld, std::int64_t n_heads,
                  std::int64_t hd, const float* cos, const float* sin);
// In place: the gradient through the rotation (its transpose, the rotation by -angle).
void rope_backward(float* dx, std::int64_t N, std::int64_t T, std::int64_t ld, std::int64_t n_heads,
                   std::int64_t hd, const float* cos, const float* sin);

// SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)); n elements.
void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n);
// dgate, dup (=) from dout.
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::int64_t n);

// Causal grouped-query attention. q[B,T,NH*hd] (row stride ldq), k and v [B,T,NKV*hd] (row
// stride ldkv); query head h reads kv head h / (NH / NKV). out[B,T,NH*hd] (contiguous);
// att[B,NH,T,T] saves the softmax probabilities. NKV == NH with q, k, v the thirds of the GPT's
// qkv rows is the GPT's attention.
void gqa_attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                           std::int64_t ldq, std::int64_t ldkv, std::int64_t B, std::int64_t T,
                           std::int64_t NH, std::int64_t NKV, std::int64_t hd);
// dq[B,T,NH*hd], dk, dv[B,T,NKV*hd] (=, contiguous) from dout[B,T,NH*hd]. A kv head's dk/dv sum
// over its group's query heads, which one task runs in order (no races, same bits on any thread
// count). scratch: scratch_slots blocks of T*T floats (at most scratch_slots threads run).
void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, std::int64_t ldq, std::int64_t ldkv,
                            const float* att, std::int64_t B, std::int64_t T, std::int64_t NH,
                            std::int64_t NKV, std::int64_t hd, float* scratch, int scratch_slots);

}  // namespace ds::nn::kernels
