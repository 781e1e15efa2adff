// Fast CPU kernels of the built-in layers: see ds/nn/kernels.h.
//
// Row kernels are plain loops written so GCC vectorizes them, compiled once per CPU kernel
// set (layer_rows.h: the op functions here take the row for ds::cpu_isa() once per call);
// exp/tanh use a Cephes-style polynomial that vectorizes (std::exp does not). The softmax
// rows also have explicit AVX-512 forms.
#include "ds/nn/kernels.h"

#include "ds/nn/gemm.h"
#include "layer_math.h"
#include "layer_rows.h"
#include "softmax_rows.h"

#include "ds/core/cpu_features.h"
#include "ds/core/env.h"
#include "ds/core/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

// GCC 12 reports the _mm512_undefined_*() inside its own AVX-512 intrinsic headers (reduce,
// max) as (maybe-)uninitialized: a false positive, every lane is written.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace ds::nn::kernels {
namespace {

#if defined(__x86_64__)
// AVX-512 forms of the two causal softmax rows, masked over the row's valid length: the
// vectorized plain loops above spend most of their time in scalar remainder iterations
// (rows of 1..T elements, 64 on average), which took the attention's softmax to ~40% of its
// forward time. Called only when the ISA in use is avx512.
__attribute__((target("avx512f,fma"))) inline __m512 exp_avx512(__m512 x) {  // fast_exp, 16 lanes
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 fx = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _mm512_set1_ps(kRound)),
                                  _mm512_set1_ps(kRound));
  const __m512 r = _mm512_sub_ps(_mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(kLn2Hi))),
                                 _mm512_mul_ps(fx, _mm512_set1_ps(kLn2Lo)));
  __m512 y = _mm512_set1_ps(kExpP[0]);
#pragma GCC unroll 6
  for (int i = 1; i < 6; ++i) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kExpP[i]));
  y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fx), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}
inline __mmask16 lanes(std::int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1);
}
__attribute__((target("avx512f,fma"))) void causal_softmax_row_avx512(float* row, std::int64_t valid,
                                                                        std::int64_t T) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (std::int64_t j = 0; j < valid; j += 16)
    mx = _mm512_mask_max_ps(mx, lanes(valid - j), mx, _mm512_maskz_loadu_ps(lanes(valid - j), row + j));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < valid; j += 16) {
    const __mmask16 k = lanes(valid - j);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, row + j), m)));
    _mm512_mask_storeu_ps(row + j, k, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(sum));
  for (std::int64_t j = 0; j < T; j += 16) {  // scale the valid part, zero the rest
    const __mmask16 k = lanes(T - j), v = j < valid ? lanes(valid - j) : __mmask16(0);
    _mm512_mask_storeu_ps(row + j, k, _mm512_maskz_mul_ps(v, _mm512_maskz_loadu_ps(v, row + j), inv));
  }
}
__attribute__((target("avx512f,fma"))) void softmax_bwd_row_avx512(float* dp, const float* p, std::int64_t valid,
                                                                     std::int64_t T) {
  __m512 acc = _mm512_setzero_ps();
  for (std::int64_t j = 0; j < valid; j += 16) {
    const __mmask16 k = lanes(valid - j);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_maskz_loadu_ps(k, dp + j), acc);
  }
  const __m512 s = _mm512_set1_ps(_mm512_reduce_add_ps(acc));
  for (std::int64_t j = 0; j < T; j += 16) {
    const __mmask16 k = lanes(T - j), v = j < valid ? lanes(valid - j) : __mmask16(0);
    const __m512 d = _mm512_mul_ps(_mm512_maskz_loadu_ps(v, p + j), _mm512_sub_ps(_mm512_maskz_loadu_ps(v, dp + j), s));
    _mm512_mask_storeu_ps(dp + j, k, _mm512_maskz_mov_ps(v, d));
  }
}
#endif  // __x86_64__

constexpr std::int64_t kChunk = 4096;

// The explicit AVX-512 row kernels (softmax rows) when the ISA in use is avx512;
// DS_NN_ROWS=plain (or DS_CPU_ISA below avx512) forces the vectorized plain loops (the tests
// cover both).
#if defined(__x86_64__)
bool use_avx512_rows() {
  return cpu_isa() == CpuIsa::avx512 && env::get_string("DS_NN_ROWS") != "plain";
}
#endif

// The causal softmax rows of the ISA in use: AVX-512's explicit forms, else the table row's.
using SoftmaxRow = void (*)(float*, std::int64_t, std::int64_t);
using SoftmaxBwdRow = void (*)(float*, const float*, std::int64_t, std::int64_t);
SoftmaxRow softmax_row_kernel() {
#if defined(__x86_64__)
  if (use_avx512_rows()) return causal_softmax_row_avx512;
#endif
  return layer_rows().causal_softmax_row;
}
SoftmaxBwdRow softmax_bwd_row_kernel() {
#if defined(__x86_64__)
  if (use_avx512_rows()) return softmax_bwd_row_avx512;
#endif
  return layer_rows().softmax_bwd_row;
}
// Below this much work a parallel region costs more than it saves (and on a loaded machine a
// descheduled thread stalls the barrier): run on the calling thread.
constexpr std::int64_t kParallelMin = 32768;

}  // namespace

void linear_forward(float* out, const float* inp, const float* w, const float* bias,
                    const float* residual, std::int64_t N, std::int64_t C, std::int64_t OC,
                    Precision prec) {
  const LayerRows& R = layer_rows();
  if (own_gemm_for_layers(prec)) {
    // Bias and residual in the GEMM's epilogue: no separate pass over out.
    GemmEpilogue ep;
    ep.bias = bias;
    if (residual && residual != out) { ep.add = residual; ep.ld_add = OC; }
    gemm_epilogue(prec, false, true, N, OC, C, 1.0f, inp, C, w, C, residual == out ? 1.0f : 0.0f, out, OC, ep);
    return;
  }
  float beta = 0.0f;
  if (bias || residual) {
    if (!(residual == out && !bias)) {
#pragma omp parallel for schedule(static) if (N * OC > kParallelMin)
      for (std::int64_t r = 0; r < N; ++r)
        R.fill_bias_row(out + r * OC, bias, residual ? residual + r * OC : nullptr, OC);
    }
    beta = 1.0f;
  }
  gemm(prec, false, true, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, std::int64_t N, std::int64_t C, std::int64_t OC,
                     bool accumulate_dinp, Precision prec, HalfGrad dw_half, bool overwrite_dw) {
  const LayerRows& R = layer_rows();
  const bool own = own_gemm_for_layers(prec);
  DS_CHECK(!dw_half.data || own, "linear_backward: a 16-bit weight gradient needs an own GEMM kernel");
  DS_CHECK(!dw_half.data || !overwrite_dw, "linear_backward: a 16-bit weight gradient only accumulates");
  const float dw_beta = overwrite_dw ? 0.0f : 1.0f;
  if (dinp) {
    if (own)
      gemm_epilogue(prec, false, false, N, C, OC, 1.0f, dout, OC, w, C, accumulate_dinp ? 1.0f : 0.0f, dinp, C, {});
    else
      gemm(prec, false, false, N, C, OC, 1.0f, dout, OC, w, C, accumulate_dinp ? 1.0f : 0.0f, dinp, C);
  }
  if (own) {
    // The bias gradient is summed while dout^T is packed for the weight gradient.
    GemmEpilogue ep;
    ep.a_row_sum = dbias;
    ep.half_c = dw_half.data;
    ep.half_bf16 = dw_half.bf16;
    gemm_epilogue(prec, true, false, OC, C, N, 1.0f, dout, OC, inp, C, dw_beta, dw_half.data ? nullptr : dw, C, ep);
    return;
  }
  gemm(prec, true, false, OC, C, N, 1.0f, dout, OC, inp, C, dw_beta, dw, C);
  if (dbias) {
    const std::int64_t blocks = (OC + 15) / 16;
#pragma omp parallel for schedule(static) if (N * OC > kParallelMin)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t c0 = b * 16;
      R.colsum_block(dbias + c0, dout + c0, N, OC, std::min<std::int64_t>(16, OC - c0));
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, std::int64_t N, std::int64_t C) {
  const LayerRows& R = layer_rows();
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r)
    R.ln_fwd_row(out + r * C, mean + r, rstd + r, inp + r * C, w, b, C);
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, std::int64_t N,
                        std::int64_t C) {
  const LayerRows& R = layer_rows();
  // Rows in fixed chunks of kLnRows, each chunk's dw / db sums in its own slot, then the
  // slots added in chunk order: the same sums for any number of threads.
  constexpr std::int64_t kLnRows = 64;
  const std::int64_t chunks = (N + kLnRows - 1) / kLnRows;
  thread_local std::vector<float> slots;  // grows to the largest call, then reused
  if (slots.size() < std::size_t(2 * chunks * C)) slots.resize(std::size_t(2 * chunks * C));
  float* part = slots.data();
  const std::int64_t blocks = (C + 15) / 16;
#pragma omp parallel if (N * C > kParallelMin)
  {
#pragma omp for schedule(static)
    for (std::int64_t ch = 0; ch < chunks; ++ch) {
      const std::int64_t r0 = ch * kLnRows;
      R.ln_bwd_rows(dinp + r0 * C, part + 2 * ch * C, part + (2 * ch + 1) * C, dout + r0 * C, inp + r0 * C, w,
                  mean + r0, rstd + r0, std::min(kLnRows, N - r0), C);
    }
#pragma omp for schedule(static)
    for (std::int64_t b = 0; b < blocks; ++b)
      for (std::int64_t c = b * 16; c < std::min(C, b * 16 + 16); ++c) {
        float sw = 0.0f, sb = 0.0f;
        for (std::int64_t ch = 0; ch < chunks; ++ch) {
          sw += part[2 * ch * C + c];
          sb += part[(2 * ch + 1) * C + c];
        }
        dw[c] += sw;
        db[c] += sb;
      }
  }
}

void gelu_forward(float* out, const float* inp, std::int64_t n) {
  const LayerRows& R = layer_rows();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    R.gelu_fwd_block(out + i0, inp + i0, std::min(kChunk, n - i0));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  const LayerRows& R = layer_rows();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    R.gelu_bwd_block(dinp + i0, inp + i0, dout + i0, std::min(kChunk, n - i0));
  }
}

void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                       std::int64_t C, std::int64_t NH) {
  const std::int64_t hd = C / NH;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int C3 = int(3 * C);
  const SoftmaxRow softmax_row = softmax_row_kernel();
  // One (batch, head) per task, contiguous ranges per thread (static): a thread takes the
  // sequences whose rows it computed in the row-split GEMM before.
#pragma omp parallel for schedule(static) if (B * NH * T * T * hd > kParallelMin)
  for (std::int64_t bh = 0; bh < B * NH; ++bh) {
    const std::int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * 3 * C + h * hd;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* S = att + bh * T * T;
    // Causal: only the lower triangle of S, and P V over k <= row.
    gemm_tri(Tri::LowerC, false, true, T, T, hd, scale, q, C3, k, C3, 0.0f, S, T);
    for (std::int64_t i = 0; i < T; ++i) softmax_row(S + i * T, i + 1, T);
    gemm_tri(Tri::LowerA, false, false, T, hd, T, 1.0f, S, T, v, C3, 0.0f, out + b * T * C + h * hd, C);
  }
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH,
                        float* scratch, int scratch_slots) {
  const std::int64_t hd = C / NH;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int C3 = int(3 * C);
  const int threads = std::max(1, std::min(scratch_slots, omp_get_max_threads()));
  const SoftmaxBwdRow softmax_bwd_row = softmax_bwd_row_kernel();
#pragma omp parallel for schedule(static) num_threads(threads) if (B * NH * T * T * hd > kParallelMin)
  for (std::int64_t bh = 0; bh < B * NH; ++bh) {
    const std::int64_t b = bh / NH, h = bh % NH;
    const float* q = qkv + b * T * 3 * C + h * hd;
    const float* k = q + C;
    const float* v = q + 2 * C;
    float* dq = dqkv + b * T * 3 * C + h * hd;
    float* dk = dq + C;
    float* dv = dq + 2 * C;
    const float* P = att + bh * T * T;
    const float* dy = dout + b * T * C + h * hd;
    float* dP = scratch + std::int64_t(omp_get_thread_num()) * T * T;
    // dP = dY V^T ; dV = P^T dY
    // (P and dS are lower triangular: each product skips the zero half.)
    gemm_tri(Tri::LowerC, false, true, T, T, hd, 1.0f, dy, C, v, C3, 0.0f, dP, T);
    gemm_tri(Tri::UpperA, true, false, T, hd, T, 1.0f, P, T, dy, C, 0.0f, dv, C3);
    for (std::int64_t i = 0; i < T; ++i) softmax_bwd_row(dP + i * T, P + i * T, i + 1, T);
    // dQ = scale dS K ; dK = scale dS^T Q
    gemm_tri(Tri::LowerA, false, false, T, hd, T, scale, dP, T, k, C3, 0.0f, dq, C3);
    gemm_tri(Tri::UpperA, true, false, T, hd, T, scale, dP, T, q, C3, 0.0f, dk, C3);
  }
}

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C) {
  const LayerRows& R = layer_rows();
#pragma omp parallel for schedule(static) if (B * T * C > kParallelMin)
  for (std::int64_t r = 0; r < B * T; ++r) {
    const std::int64_t t = r % T;
    R.emb_fwd_row(out + r * C, wte + std::int64_t(tokens[r]) * C, wpe ? wpe + t * C : nullptr, C);
  }
}

void embedding_backward(float* dwte, float* dwpe, const float* dout, const std::int32_t* tokens,
                        std::int64_t B, std::int64_t T, std::int64_t C) {
  // Threads own disjoint channel ranges, so repeated tokens never race.
  const std::int64_t blocks = (C + 15) / 16;
#pragma omp parallel for schedule(static) if (B * T * C > kParallelMin)
  for (std::int64_t blk = 0; blk < blocks; ++blk) {
    const std::int64_t c0 = blk * 16, w = std::min<std::int64_t>(16, C - c0);
    for (std::int64_t r = 0; r < B * T; ++r) {
      const float* d = dout + r * C + c0;
      float* a = dwte + std::int64_t(tokens[r]) * C + c0;
      for (std::int64_t c = 0; c < w; ++c) a[c] += d[c];
      if (dwpe) {
        float* p = dwpe + (r % T) * C + c0;
        for (std::int64_t c = 0; c < w; ++c) p[c] += d[c];
      }
    }
  }
}

float crossentropy_forward(float* lse, const float* logits, const std::int32_t* targets,
                           std::int64_t N, std::int64_t V) {
  const LayerRows& R = layer_rows();
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (N * V > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r) {
    const float* l = logits + r * V;
    const float z = R.xent_fwd_row(l, V, lse + r);
    total += double(z - l[targets[r]]);
  }
  return float(total / double(N));
}

void crossentropy_backward(float* logits, const float* lse, const std::int32_t* targets,
                           std::int64_t N, std::int64_t V, float scale, std::int64_t mean_over) {
  const LayerRows& R = layer_rows();
  const float k = scale / float(mean_over > 0 ? mean_over : N);
#pragma omp parallel for schedule(static) if (N * V > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r) {
    float* l = logits + r * V;
    R.xent_bwd_row(l, lse[r], V, k);
    l[targets[r]] -= k;
  }
}

void add_inplace(float* a, const float* b, std::int64_t n) {
  const LayerRows& R = layer_rows();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    R.add_block(a + i0, b + i0, std::min(kChunk, n - i0));
  }
}

void causal_softmax_rows(float* S, std::int64_t T) {
  const SoftmaxRow softmax_row = softmax_row_kernel();
  for (std::int64_t i = 0; i < T; ++i) softmax_row(S + i * T, i + 1, T);
}

void causal_softmax_bwd_rows(float* dP, const float* P, std::int64_t T) {
  const SoftmaxBwdRow softmax_bwd_row = softmax_bwd_row_kernel();
  for (std::int64_t i = 0; i < T; ++i) softmax_bwd_row(dP + i * T, P + i * T, i + 1, T);
}

}  // namespace ds::nn::kernels
