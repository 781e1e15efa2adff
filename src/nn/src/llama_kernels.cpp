// CPU kernels of the Llama-style decoder: see ds/nn/llama_kernels.h. The row loops are in
// the layer row table (layer_rows.h: one copy per CPU kernel set, as the GPT's); the
// attention is the GPT's (triangular GEMMs + the shared softmax rows) with the kv head of a
// query head looked up by group.
#include "ds/nn/llama_kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ds/nn/gemm.h"
#include "layer_rows.h"
#include "softmax_rows.h"

namespace ds::nn::kernels {
namespace {

// Below this much work a parallel region costs more than it saves (kernels.cpp's threshold).
constexpr std::int64_t kParallelMin = 32768;
constexpr std::int64_t kChunk = 4096;

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* w, std::int64_t N,
                     std::int64_t C, float eps) {
  const LayerRows& R = layer_rows();
#pragma omp parallel for schedule(static) if (N * C > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r) R.rms_fwd_row(out + r * C, rstd + r, inp + r * C, w, C, eps);
}

void rmsnorm_backward(float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                      const float* rstd, std::int64_t N, std::int64_t C) {
  const LayerRows& R = layer_rows();
  // Rows split among the threads, each summing its dw part on the side; the parts are added in
  // thread order afterwards (the same bits for a given thread count).
  const int threads = N * C > kParallelMin ? std::max(1, omp_get_max_threads()) : 1;
  std::vector<float> parts(std::size_t(threads) * std::size_t(C), 0.0f);
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    float* part = parts.data() + std::size_t(t) * std::size_t(C);
    for (std::int64_t r = N * t / nt; r < N * (t + 1) / nt; ++r)
      R.rms_bwd_row(dinp + r * C, part, dout + r * C, inp + r * C, w, rstd[r], C);
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
  const LayerRows& R = layer_rows();
  const std::int64_t h2 = hd / 2;
#pragma omp parallel for schedule(static) if (N * n_heads * hd > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r)
    R.rope_row(x + r * ld, cos + (r % T) * h2, sin + (r % T) * h2, n_heads, hd, 1.0f);
}

void rope_backward(float* dx, std::int64_t N, std::int64_t T, std::int64_t ld, std::int64_t n_heads,
                   std::int64_t hd, const float* cos, const float* sin) {
  const LayerRows& R = layer_rows();
  const std::int64_t h2 = hd / 2;
#pragma omp parallel for schedule(static) if (N * n_heads * hd > kParallelMin)
  for (std::int64_t r = 0; r < N; ++r)
    R.rope_row(dx + r * ld, cos + (r % T) * h2, sin + (r % T) * h2, n_heads, hd, -1.0f);
}

void swiglu_forward(float* out, const float* gate, const float* up, std::int64_t n) {
  const LayerRows& R = layer_rows();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    R.swiglu_fwd_block(out + i0, gate + i0, up + i0, std::min(kChunk, n - i0));
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate, const float* up,
                     std::int64_t n) {
  const LayerRows& R = layer_rows();
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (std::int64_t c = 0; c < chunks; ++c) {
    const std::int64_t i0 = c * kChunk;
    R.swiglu_bwd_block(dgate + i0, dup + i0, dout + i0, gate + i0, up + i0, std::min(kChunk, n - i0));
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
