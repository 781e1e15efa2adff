// Fast CPU kernels of the built-in layers: see ds/nn/kernels.h.
//
// Row kernels are plain loops written so GCC vectorizes them; target_clones builds an
// AVX-512 and an AVX2+FMA copy beside the baseline one and the loader picks the best the
// CPU has (the library itself is built for baseline x86-64). exp/tanh use a Cephes-style
// polynomial that vectorizes (std::exp does not).
#include "ds/nn/kernels.h"

#include "ds/nn/gemm.h"
#include "softmax_rows.h"

#include "ds/core/cpu_features.h"
#include "ds/core/env.h"
#include "ds/core/error.h"

#include <immintrin.h>
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

#define DS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace ds::nn::kernels {
namespace {

// Cephes expf: x = n ln2 + r (ln2 split in a high and a low part), exp(r) by a degree-6
// polynomial. Shared by the scalar fast_exp and its AVX-512 form below.
constexpr float kLog2e = 1.44269504088896341f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to nearest
constexpr float kExpP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                            4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// exp(x) to ~2 ulp over [-87, 88]; inputs outside are clamped.
inline float fast_exp(float x) {
  x = x < -87.0f ? -87.0f : x;  // ternaries, not std::min/max: these vectorize
  x = x > 88.0f ? 88.0f : x;
  // Round to nearest by the 1.5 * 2^23 trick (no floor(): a libm call without SSE4.1).
  const float fx = (x * kLog2e + kRound) - kRound;
  const float r = x - fx * kLn2Hi - fx * kLn2Lo;
  float y = kExpP[0];
#pragma GCC unroll 6
  for (int i = 1; i < 6; ++i) y = y * r + kExpP[i];
  y = y * (r * r) + r + 1.0f;
  const std::uint32_t bits = std::uint32_t(std::int32_t(fx) + 127) << 23;
  return y * std::bit_cast<float>(bits);
}

inline float fast_tanh(float u) { return 1.0f - 2.0f / (fast_exp(2.0f * u) + 1.0f); }

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluA = 0.044715f;

DS_CLONES void gelu_fwd_block(float* __restrict out, const float* __restrict inp, std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float t = fast_tanh(kGeluS * (x + kGeluA * x * x * x));
    out[i] = 0.5f * x * (1.0f + t);
  }
}

DS_CLONES void gelu_bwd_block(float* dinp, const float* __restrict inp, const float* dout,
                              std::int64_t n) {
#pragma omp simd
  for (std::int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float t = fast_tanh(kGeluS * (x + kGeluA * x * x * x));
    const float sech2 = 1.0f - t * t;
    const float g = 0.5f * (1.0f + t) + 0.5f * x * sech2 * kGeluS * (1.0f + 3.0f * kGeluA * x * x);
    dinp[i] = dout[i] * g;
  }
}

DS_CLONES void ln_fwd_row(float* __restrict o, float* mean_out, float* rstd_out,
                          const float* __restrict x, const float* __restrict w,
                          const float* __restrict b, std::int64_t C) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t i = 0; i < C; ++i) s += x[i];
  const float m = s / float(C);
  float v = 0.0f;
#pragma omp simd reduction(+ : v)
  for (std::int64_t i = 0; i < C; ++i) { const float d = x[i] - m; v += d * d; }
  const float r = 1.0f / std::sqrt(v / float(C) + 1e-5f);
#pragma omp simd
  for (std::int64_t i = 0; i < C; ++i) o[i] = (x[i] - m) * r * w[i] + b[i];
  *mean_out = m;
  *rstd_out = r;
}

// LayerNorm backward of `rows` rows in one pass: dx += (w dy - mean(w dy) - xhat
// mean(w dy xhat)) rstd per row, and the rows' dw / db sums (sum of dy xhat, of dy) into
// pw / pb (C floats each, overwritten). Reading dy and x once for both halves saves the
// second pass over them that column sums after the row pass took.
DS_CLONES void ln_bwd_rows(float* __restrict dx, float* __restrict pw, float* __restrict pb,
                           const float* __restrict dy, const float* __restrict x, const float* __restrict w,
                           const float* mean, const float* rstd, std::int64_t rows, std::int64_t C) {
  for (std::int64_t i = 0; i < C; ++i) { pw[i] = 0.0f; pb[i] = 0.0f; }
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* d = dy + r * C;
    const float* xr = x + r * C;
    float* o = dx + r * C;
    const float m = mean[r], s = rstd[r];
    float a = 0.0f, bsum = 0.0f;
#pragma omp simd reduction(+ : a, bsum)
    for (std::int64_t i = 0; i < C; ++i) {
      const float n = (xr[i] - m) * s;
      const float dn = w[i] * d[i];
      a += dn;
      bsum += dn * n;
      pw[i] += d[i] * n;
      pb[i] += d[i];
    }
    a /= float(C);
    bsum /= float(C);
#pragma omp simd
    for (std::int64_t i = 0; i < C; ++i) {
      const float n = (xr[i] - m) * s;
      o[i] += (w[i] * d[i] - a - n * bsum) * s;
    }
  }
}

// Column sums over rows for a block of up to 16 columns: dst[c] += sum_r src[r*ld + c].
DS_CLONES void colsum_block(float* __restrict dst, const float* __restrict src, std::int64_t rows,
                            std::int64_t ld, std::int64_t width) {
  float acc[16] = {0};
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* s = src + r * ld;
    for (std::int64_t c = 0; c < width; ++c) acc[c] += s[c];
  }
  for (std::int64_t c = 0; c < width; ++c) dst[c] += acc[c];
}

// Row softmax of the causal row i (entries 0..i), scaled scores in place; rest zeroed.
DS_CLONES void causal_softmax_row(float* __restrict row, std::int64_t valid, std::int64_t T) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (std::int64_t j = 0; j < valid; ++j) mx = row[j] > mx ? row[j] : mx;
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t j = 0; j < valid; ++j) { const float e = fast_exp(row[j] - mx); row[j] = e; s += e; }
  const float inv = 1.0f / s;
#pragma omp simd
  for (std::int64_t j = 0; j < valid; ++j) row[j] *= inv;
  for (std::int64_t j = valid; j < T; ++j) row[j] = 0.0f;
}

// AVX-512 forms of the two causal softmax rows, masked over the row's valid length: the
// vectorized plain loops above spend most of their time in scalar remainder iterations
// (rows of 1..T elements, 64 on average), which took the attention's softmax to ~40% of its
// forward time. Called only when cpu_features() has AVX-512F.
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

// dS = P * (dP - sum(P * dP)) on the causal part, zero elsewhere (in place over dP).
DS_CLONES void softmax_bwd_row(float* __restrict dp, const float* __restrict p, std::int64_t valid,
                               std::int64_t T) {
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t j = 0; j < valid; ++j) s += p[j] * dp[j];
#pragma omp simd
  for (std::int64_t j = 0; j < valid; ++j) dp[j] = p[j] * (dp[j] - s);
  for (std::int64_t j = valid; j < T; ++j) dp[j] = 0.0f;
}

DS_CLONES float xent_fwd_row(const float* __restrict l, std::int64_t V, float* lse_out) {
  float mx = -INFINITY;
#pragma omp simd reduction(max : mx)
  for (std::int64_t j = 0; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
  float s = 0.0f;
#pragma omp simd reduction(+ : s)
  for (std::int64_t j = 0; j < V; ++j) s += fast_exp(l[j] - mx);
  const float lse = mx + std::log(s);
  *lse_out = lse;
  return lse;
}

DS_CLONES void xent_bwd_row(float* __restrict l, float lse, std::int64_t V, float k) {
#pragma omp simd
  for (std::int64_t j = 0; j < V; ++j) l[j] = k * fast_exp(l[j] - lse);
}

DS_CLONES void fill_bias_row(float* __restrict o, const float* __restrict bias,
                             const float* __restrict res, std::int64_t OC) {
  if (res && bias) {
    for (std::int64_t j = 0; j < OC; ++j) o[j] = res[j] + bias[j];
  } else if (bias) {
    for (std::int64_t j = 0; j < OC; ++j) o[j] = bias[j];
  } else {
    for (std::int64_t j = 0; j < OC; ++j) o[j] = res[j];
  }
}

DS_CLONES void add_block(float* __restrict a, const float* __restrict b, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) a[i] += b[i];
}

DS_CLONES void emb_fwd_row(float* __restrict o, const float* __restrict a, const float* __restrict p,
                           std::int64_t C) {
  if (p) {
    for (std::int64_t i = 0; i < C; ++i) o[i] = a[i] + p[i];
  } else {
    for (std::int64_t i = 0; i < C; ++i) o[i] = a[i];
  }
}

constexpr std::int64_t kChunk = 4096;

// The explicit AVX-512 row kernels (softmax rows) when the ISA in use is avx512;
// DS_NN_ROWS=plain (or DS_CPU_ISA below avx512) forces the vectorized plain loops (the tests
// cover both).
bool use_avx512_rows() {
  return cpu_isa() == CpuIsa::avx512 && env::get_string("DS_NN_ROWS") != "plain";
}
// Below this much work a parallel region costs more than it saves (and on a loaded machine a
// descheduled thread stalls the barrier): run on the calling thread.
constexpr std::int64_t kParallelMin = 32768;

}  // namespace

void linear_forward(float* out, const float* inp, const float* w, const float* bias,
                    const float* residual, std::int64_t N, std::int64_t C, std::int64_t OC,
                    Precision prec) {
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
        fill_bias_row(out + r * OC, bias, residual ? residual + r * OC : nullptr, OC);
    }
    beta = 1.0f;
  }
  gemm(prec, false, true, N, OC, C, 1.0f, inp, C, w, C, beta, out, OC);
}

void linear_backward(float* dinp, float* dw, float* dbias, const float* dout, const float* inp,
                     const float* w, std::int64_t N, std::int64_t C, std::int64_t OC,
                     bool accumulate_dinp, Precision prec, HalfGrad dw_half, bool overwrite_dw) {
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
      colsum_block(dbias + c0, dout + c0, N, OC, std::min<std::int64_t>(16, OC - c0));
    }
  }
}

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* w,
                       const float* b, std::int64_t N, std::int64_t C) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r)
    ln_fwd_row(out + r * C, mean + r, rstd + r, inp + r * C, w, b, C);
}

void layernorm_backward(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                        const float* w, const float* mean, const float* rstd, std::int64_t N,
                        std::int64_t C) {
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
      ln_bwd_rows(dinp + r0 * C, part + 2 * ch * C, part + (2 * ch + 1) * C, dout + r0 * C, inp + r0 * C, w,
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
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    gelu_fwd_block(out + i0, inp + i0, std::min(kChunk, n - i0));
  }
}

void gelu_backward(float* dinp, const float* inp, const float* dout, std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    gelu_bwd_block(dinp + i0, inp + i0, dout + i0, std::min(kChunk, n - i0));
  }
}

void attention_forward(float* out, float* att, const float* qkv, std::int64_t B, std::int64_t T,
                       std::int64_t C, std::int64_t NH) {
  const std::int64_t hd = C / NH;
  const float scale = 1.0f / std::sqrt(float(hd));
  const int C3 = int(3 * C);
  const bool avx512 = use_avx512_rows();
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
    for (std::int64_t i = 0; i < T; ++i)
      if (avx512) causal_softmax_row_avx512(S + i * T, i + 1, T);
      else causal_softmax_row(S + i * T, i + 1, T);
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
  const bool avx512 = use_avx512_rows();
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
    for (std::int64_t i = 0; i < T; ++i)
      if (avx512) softmax_bwd_row_avx512(dP + i * T, P + i * T, i + 1, T);
      else softmax_bwd_row(dP + i * T, P + i * T, i + 1, T);
    // dQ = scale dS K ; dK = scale dS^T Q
    gemm_tri(Tri::LowerA, false, false, T, hd, T, scale, dP, T, k, C3, 0.0f, dq, C3);
    gemm_tri(Tri::UpperA, true, false, T, hd, T, scale, dP, T, q, C3, 0.0f, dk, C3);
  }
}

void embedding_forward(float* out, const std::int32_t* tokens, const float* wte, const float* wpe,
                       std::int64_t B, std::int64_t T, std::int64_t C) {
#pragma omp parallel for schedule(static) if (B * T * C > kParallelMin)
  for (std::int64_t r = 0; r < B * T; ++r) {
    const std::int64_t t = r % T;
    emb_fwd_row(out + r * C, wte + std::int64_t(tokens[r]) * C, wpe ? wpe + t * C : nullptr, C);
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
  double total = 0.0;
#pragma omp parallel for schedule(static) reduction(+ : total) if (N * V > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r) {
    const float* l = logits + r * V;
    const float z = xent_fwd_row(l, V, lse + r);
    total += double(z - l[targets[r]]);
  }
  return float(total / double(N));
}

void crossentropy_backward(float* logits, const float* lse, const std::int32_t* targets,
                           std::int64_t N, std::int64_t V, float scale, std::int64_t mean_over) {
  const float k = scale / float(mean_over > 0 ? mean_over : N);
#pragma omp parallel for schedule(static) if (N * V > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r) {
    float* l = logits + r * V;
    xent_bwd_row(l, lse[r], V, k);
    l[targets[r]] -= k;
  }
}

void add_inplace(float* a, const float* b, std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    add_block(a + i0, b + i0, std::min(kChunk, n - i0));
  }
}

void causal_softmax_rows(float* S, std::int64_t T) {
  const bool avx512 = use_avx512_rows();
  for (std::int64_t i = 0; i < T; ++i)
    if (avx512) causal_softmax_row_avx512(S + i * T, i + 1, T);
    else causal_softmax_row(S + i * T, i + 1, T);
}

void causal_softmax_bwd_rows(float* dP, const float* P, std::int64_t T) {
  const bool avx512 = use_avx512_rows();
  for (std::int64_t i = 0; i < T; ++i)
    if (avx512) softmax_bwd_row_avx512(dP + i * T, P + i * T, i + 1, T);
    else softmax_bwd_row(dP + i * T, P + i * T, i + 1, T);
}

}  // namespace ds::nn::kernels
