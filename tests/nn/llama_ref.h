// Plain reference versions of the Llama kernels (ds/nn/llama_kernels.h): the obvious loops,
// templated so the tests can run them in double precision. Same arguments and meaning.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace ds::nn::ref {

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* w, std::int64_t N, std::int64_t C, T eps) {
  for (std::int64_t r = 0; r < N; ++r) {
    T ss = 0;
    for (std::int64_t i = 0; i < C; ++i) ss += inp[r * C + i] * inp[r * C + i];
    const T s = T(1) / std::sqrt(ss / T(C) + eps);
    for (std::int64_t i = 0; i < C; ++i) out[r * C + i] = w[i] * inp[r * C + i] * s;
    rstd[r] = s;
  }
}

template <typename T>
void rmsnorm_backward(T* dinp, T* dw, const T* dout, const T* inp, const T* w, const T* rstd,
                      std::int64_t N, std::int64_t C) {
  for (std::int64_t r = 0; r < N; ++r) {
    const T* x = inp + r * C;
    const T* dy = dout + r * C;
    T dot = 0;  // sum of w dy n
    for (std::int64_t i = 0; i < C; ++i) dot += w[i] * dy[i] * x[i] * rstd[r];
    for (std::int64_t i = 0; i < C; ++i) {
      const T n = x[i] * rstd[r];
      dw[i] += dy[i] * n;
      dinp[r * C + i] += rstd[r] * (w[i] * dy[i] - n * dot / T(C));
    }
  }
}

// HF rotate_half: out = x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1), angles
// t * theta^(-2i/hd) computed here from scratch (no tables).
template <typename T>
void rope_forward(T* x, std::int64_t N, std::int64_t Tn, std::int64_t ld, std::int64_t n_heads,
                  std::int64_t hd, double theta) {
  const std::int64_t h2 = hd / 2;
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t h = 0; h < n_heads; ++h) {
      T* a = x + r * ld + h * hd;
      for (std::int64_t i = 0; i < h2; ++i) {
        const double ang = double(r % Tn) / std::pow(theta, double(2 * i) / double(hd));
        const T c = T(std::cos(ang)), s = T(std::sin(ang));
        const T x1 = a[i], x2 = a[i + h2];
        a[i] = x1 * c - x2 * s;
        a[i + h2] = x2 * c + x1 * s;
      }
    }
}

template <typename T>
void swiglu_forward(T* out, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = gate[i] / (T(1) + std::exp(-gate[i])) * up[i];
}

template <typename T>
void swiglu_backward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-gate[i]));
    dup[i] = dout[i] * gate[i] * s;
    dgate[i] = dout[i] * up[i] * (s + gate[i] * s * (T(1) - s));
  }
}

// Causal GQA attention: query head h reads kv head h / (NH / NKV).
template <typename T>
void gqa_attention_forward(T* out, T* att, const T* q, const T* k, const T* v, std::int64_t ldq,
                           std::int64_t ldkv, std::int64_t B, std::int64_t Tn, std::int64_t NH,
                           std::int64_t NKV, std::int64_t hd) {
  const T scale = T(1) / std::sqrt(T(hd));
  const std::int64_t C = NH * hd;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < NH; ++h) {
      const std::int64_t kvh = h / (NH / NKV);
      for (std::int64_t i = 0; i < Tn; ++i) {
        const T* qi = q + (b * Tn + i) * ldq + h * hd;
        T* p = att + ((b * NH + h) * Tn + i) * Tn;
        T mx = -INFINITY;
        for (std::int64_t j = 0; j <= i; ++j) {
          const T* kj = k + (b * Tn + j) * ldkv + kvh * hd;
          T s = 0;
          for (std::int64_t d = 0; d < hd; ++d) s += qi[d] * kj[d];
          p[j] = s * scale;
          if (p[j] > mx) mx = p[j];
        }
        T sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) { p[j] = std::exp(p[j] - mx); sum += p[j]; }
        for (std::int64_t j = 0; j <= i; ++j) p[j] /= sum;
        for (std::int64_t j = i + 1; j < Tn; ++j) p[j] = 0;
        for (std::int64_t d = 0; d < hd; ++d) {
          T s = 0;
          for (std::int64_t j = 0; j <= i; ++j) s += p[j] * v[(b * Tn + j) * ldkv + kvh * hd + d];
          out[(b * Tn + i) * C + h * hd + d] = s;
        }
      }
    }
}

}  // namespace ds::nn::ref
