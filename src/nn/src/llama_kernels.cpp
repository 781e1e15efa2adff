// CPU kernels of the Llama-style decoder: see ds/nn/llama_kernels.h. Row loops written so GCC
// vectorizes them (target_clones: AVX-512, AVX2 and baseline copies, as kernels.cpp); the
// attention is the GPT's (triangular GEMMs + the shared softmax rows) with the kv head of a
// query head looked up by group.
#include "ds/nn/llama_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ds/nn/gemm.h"
#include "softmax_rows.h"

#define DS_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))

namespace ds::nn::kernels {
namespace {

// Below this much work a parallel region costs more than it saves (kernels.cpp's threshold).
constexpr std::int64_t kParallelMin = 32768;
constexpr std::int64_t kChunk = 4096;

DS_CLONES void rms_fwd_row(float* __restrict o, float* rstd_out, const float* __restrict x,
                           const float* __restrict w, std::int64_t C, float eps) {
  float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
  for (std::int64_t i = 0; i < C; ++i) ss += x[i] * x[i];
  const float r = 1.0f / std::sqrt(ss / float(C) + eps);
#pragma omp simd
  for (std::int64_t i = 0; i < C; ++i) o[i] = w[i] * (x[i] * r);
  *rstd_out = r;
}

// dx += r (w dy - x r^2 mean(w dy x)) (the rstd term of every element), dw_part += dy x r.
DS_CLONES void rms_bwd_row(float* __restrict dx, float* __restrict dw, const float* __restrict dy,
                           const float* __restrict x, const float* __restrict w, float r, std::int64_t C) {
  float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
  for (std::int64_t i = 0; i < C; ++i) dot += w[i] * dy[i] * x[i];
  const float k = dot * r * r / float(C);
#pragma omp simd
  for (std::int64_t i = 0; i < C; ++i) {
    dx[i] += r * (w[i] * dy[i] - x[i] * k);
    dw[i] += dy[i] * x[i] * r;
  }
}

DS_CLONES void rope_row(float* __restrict x, const float* __restrict c, const float* __restrict s,
                        std::int64_t n_heads, std::int64_t hd, float sign) {
  const std::int64_t h2 = hd / 2;
  for (std::int64_t h = 0; h < n_heads; ++h) {
    float* a = x + h * hd;
    float* b = a + h2;
#pragma omp simd
    for (std::int64_t i = 0; i < h2; ++i) {
      const float x1 = a[i], x2 = b[i], sn = sign * s[i];
      a[i] = x1 * c[i] - x2 * sn;
      b[i] = x2 * c[i] + x1 * sn;
    }
  }
}

DS_CLONES void swiglu_fwd_block(float* __restrict o, const float* __restrict g, const float* __restrict u,
                                std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

DS_CLONES void swiglu_bwd_block(float* __restrict dg, float* __restrict du, const float* __restrict dy,
                                const float* __restrict g, const float* __restrict u, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float sig = 1.0f / (1.0f + std::exp(-g[i]));
    const float silu = g[i] * sig;
    du[i] = dy[i] * silu;
    dg[i] = dy[i] * u[i] * sig * (1.0f + g[i] * (1.0f - sig));
  }
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                     std::int64_t C, float eps) {
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r) rms_fwd_row(out + r * C, rstd + r, inp + r * C, w, C, eps);
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, std::int64_t N, std::int64_t C) {
  // Rows split among the threads, each summing its dw part on the side; the parts are added in
  // thread order afterwards (the same bits for a given thread count).
  const int threads = N * C > kParallelMin ? std::max(1, omp_get_max_threads()) : 1;
  std::vector<float> parts(std::size_t(threads) * std::size_t(C), 0.0f);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    float* part = parts.data() + std::size_t(t) * std::size_t(C);
    for (std::int64_t r = N * t / nt; r < N * (t + 1) / nt; ++r)
      rms_bwd_row(dinp + r * C, part, dout + r * C, inp + r * C, w, rstd[r], C);
  }
  for (int t = 0; t < threads; ++t)
    for (std::int64_t i = 0; i < C; ++i) dw[i] += parts[std::size_t(t) * std::size_t(C) + std::size_t(i)];
}

void rope_tables(float* cos, float* sin, std::int64_t T, std::int64_t hd, double theta) {
  const std::int64_t h2 = hd / 2;
  for (std::int64_t i = 0; i < h2; ++i) {
    const double inv_freq = 1.0 / std::pow(theta, double(2 * i) / double(hd));
    for (std::int64_t t = 0; t < T; ++t) {
      cos[t * h2 + i] = float(std::cos(double(t) * inv_freq));
      sin[t * h2 + i] = float(std::sin(double(t) * inv_freq));
    }
  }
}

void rope_forward(float* x, std::int64_t N, std::int64_t T, std::int64_t ld, std::int64_t n_heads,
                  std::int64_t hd, const float* cos, const float* sin) {
  const std::int64_t h2 = hd / 2;
#pragma omp parallel for schedule(static) if (N * n_heads * hd > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r)
    rope_row(x + r * ld, cos + (r % T) * h2, sin + (r % T) * h2, n_heads, hd, 1.0f);
}

void rope_backward(float* dx, std::int64_t N, std::int64_t T, std::int64_t ld, std::int64_t n_heads,
                   std::int64_t hd, const float* cos, const float* sin) {
  const std::int64_t h2 = hd / 2;
#pragma omp parallel for schedule(static) if (N * n_heads * hd > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r)
    rope_row(dx + r * ld, cos + (r % T) * h2, sin + (r % T) * h2, n_heads, hd, -1.0f);
}

void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    swiglu_fwd_block(out + i0, gate + i0, up + i0, std::min(kChunk, n - i0));
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    swiglu_bwd_block(dgate + i0, dup + i0, dout + i0, gate + i0, up + i0, std::min(kChunk, n - i0));
  }
}

void gqa_attention_forward(float* out, float* att, const float* q, const float* k, const float* v,
                           std::int64_t ldq, std::int64_t ldkv, std::int64_t B, std::int64_t T,
                           std::int64_t NH, std::int64_t NKV, std::int64_t hd) {
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::int64_t group = NH / NKV, C = NH * hd;
#pragma omp parallel for schedule(static) if (B * NH * T * T * hd > kParallelMin)
  for (std::int64_t bh = 0; bh < B * NH; ++bh) {
    const std::int64_t b = bh / NH, h = bh % NH, kvh = h / group;
    const float* qh = q + b * T * ldq + h * hd;
    const float* kh = k + b * T * ldkv + kvh * hd;
    const float* vh = v + b * T * ldkv + kvh * hd;
    float* S = att + bh * T * T;
    gemm_tri(Tri::LowerC, false, true, T, T, hd, scale, qh, ldq, kh, ldkv, 0.0f, S, T);
    causal_softmax_rows(S, T);
    gemm_tri(Tri::LowerA, false, false, T, hd, T, 1.0f, S, T, vh, ldkv, 0.0f, out + b * T * C + h * hd, C);
  }
}

void gqa_attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                            const float* k, const float* v, std::int64_t ldq, std::int64_t ldkv,
                            const float* att, std::int64_t B, std::int64_t T, std::int64_t NH,
                            std::int64_t NKV, std::int64_t hd, float* scratch, int scratch_slots) {
  const float scale = 1.0f / std::sqrt(float(hd));
  const std::int64_t group = NH / NKV, C = NH * hd, KV = NKV * hd;
  const int threads = std::max(1, std::min(scratch_slots, omp_get_max_threads()));
  // One (batch, kv head) per task: its group's query heads in order, the first writing dk/dv
  // (beta 0), the others adding to them.
#pragma omp parallel for schedule(static) num_threads(threads) if (B * NH * T * T * hd > kParallelMin)
  for (std::int64_t bkv = 0; bkv < B * NKV; ++bkv) {
    const std::int64_t b = bkv / NKV, kvh = bkv % NKV;
    const float* kh = k + b * T * ldkv + kvh * hd;
    const float* vh = v + b * T * ldkv + kvh * hd;
    float* dkh = dk + b * T * KV + kvh * hd;
    float* dvh = dv + b * T * KV + kvh * hd;
    float* dP = scratch + std::int64_t(omp_get_thread_num()) * T * T;
    for (std::int64_t j = 0; j < group; ++j) {
      const std::int64_t h = kvh * group + j;
      const float beta = j == 0 ? 0.0f : 1.0f;
      const float* qh = q + b * T * ldq + h * hd;
      const float* P = att + (b * NH + h) * T * T;
      const float* dy = dout + b * T * C + h * hd;
      float* dqh = dq + b * T * C + h * hd;
      // dP = dY V^T ; dV (+)= P^T dY ; dS = softmax backward ; dQ = scale dS K ; dK (+)= scale dS^T Q
      gemm_tri(Tri::LowerC, false, true, T, T, hd, 1.0f, dy, C, vh, ldkv, 0.0f, dP, T);
      gemm_tri(Tri::UpperA, true, false, T, hd, T, 1.0f, P, T, dy, C, beta, dvh, KV);
      causal_softmax_bwd_rows(dP, P, T);
      gemm_tri(Tri::LowerA, false, false, T, hd, T, scale, dP, T, kh, ldkv, 0.0f, dqh, C);
      gemm_tri(Tri::UpperA, true, false, T, hd, T, scale, dP, T, qh, ldq, beta, dkh, KV);
    }
  }
}

}  // namespace ds::nn::kernels
