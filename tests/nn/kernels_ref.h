// Plain reference versions of the kernels in kernels.h: the obvious loops, templated on the
// element type so the tests can run them in double precision (finite-difference gradient
// checks) and compare the fast fp32 kernels against them. Same arguments, same meaning
// (attention_backward_ref needs no scratch).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace ds::nn::ref {

template <typename T>
void linear_forward(T* out, const T* inp, const T* w, const T* bias, const T* residual,
                    std::int64_t N, std::int64_t C, std::int64_t OC) {
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t o = 0; o < OC; ++o) {
      T s = bias ? bias[o] : T(0);
      if (residual) s += residual[r * OC + o];
      for (std::int64_t c = 0; c < C; ++c) s += inp[r * C + c] * w[o * C + c];
      out[r * OC + o] = s;
    }
}

template <typename T>
void linear_backward(T* dinp, T* dw, T* dbias, const T* dout, const T* inp, const T* w,
                     std::int64_t N, std::int64_t C, std::int64_t OC, bool accumulate_dinp) {
  for (std::int64_t r = 0; r < N; ++r) {
    for (std::int64_t c = 0; c < C; ++c) {
      T s = 0;
      for (std::int64_t o = 0; o < OC; ++o) s += dout[r * OC + o] * w[o * C + c];
      if (dinp) dinp[r * C + c] = (accumulate_dinp ? dinp[r * C + c] : T(0)) + s;
    }
    for (std::int64_t o = 0; o < OC; ++o) {
      const T d = dout[r * OC + o];
      if (dbias) dbias[o] += d;
      for (std::int64_t c = 0; c < C; ++c) dw[o * C + c] += d * inp[r * C + c];
    }
  }
}

template <typename T>
void layernorm_forward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b,
                       std::int64_t N, std::int64_t C) {
  for (std::int64_t r = 0; r < N; ++r) {
    const T* x = inp + r * C;
    T m = 0;
    for (std::int64_t i = 0; i < C; ++i) m += x[i];
    m /= T(C);
    T v = 0;
    for (std::int64_t i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
    v /= T(C);
    const T s = T(1) / std::sqrt(v + T(1e-5));
    for (std::int64_t i = 0; i < C; ++i) out[r * C + i] = (x[i] - m) * s * w[i] + b[i];
    mean[r] = m;
    rstd[r] = s;
  }
}

template <typename T>
void layernorm_backward(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w,
                        const T* mean, const T* rstd, std::int64_t N, std::int64_t C) {
  for (std::int64_t r = 0; r < N; ++r) {
    const T* x = inp + r * C;
    const T* dy = dout + r * C;
    T a = 0, bb = 0;
    for (std::int64_t i = 0; i < C; ++i) {
      const T n = (x[i] - mean[r]) * rstd[r];
      a += w[i] * dy[i];
      bb += w[i] * dy[i] * n;
    }
    a /= T(C);
    bb /= T(C);
    for (std::int64_t i = 0; i < C; ++i) {
      const T n = (x[i] - mean[r]) * rstd[r];
      db[i] += dy[i];
      dw[i] += n * dy[i];
      dinp[r * C + i] += (w[i] * dy[i] - a - n * bb) * rstd[r];
    }
  }
}

template <typename T>
void gelu_forward(T* out, const T* inp, std::int64_t n) {
  const T s = std::sqrt(T(2) / T(M_PI));
  for (std::int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + std::tanh(s * (x + T(0.044715) * x * x * x)));
  }
}

template <typename T>
void gelu_backward(T* dinp, const T* inp, const T* dout, std::int64_t n) {
  const T s = std::sqrt(T(2) / T(M_PI));
  for (std::int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T t = std::tanh(s * (x + T(0.044715) * x * x * x));
    const T g = T(0.5) * (T(1) + t) +
                T(0.5) * x * (T(1) - t * t) * s * (T(1) + T(3) * T(0.044715) * x * x);
    dinp[i] = dout[i] * g;
  }
}

template <typename T>
void attention_forward(T* out, T* att, const T* qkv, std::int64_t B, std::int64_t Tn,
                       std::int64_t C, std::int64_t NH) {
  const std::int64_t hd = C / NH;
  const T scale = T(1) / std::sqrt(T(hd));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < NH; ++h)
      for (std::int64_t i = 0; i < Tn; ++i) {
        const T* q = qkv + (b * Tn + i) * 3 * C + h * hd;
        T* p = att + ((b * NH + h) * Tn + i) * Tn;
        T mx = -INFINITY;
        for (std::int64_t j = 0; j <= i; ++j) {
          const T* k = qkv + (b * Tn + j) * 3 * C + C + h * hd;
          T s = 0;
          for (std::int64_t d = 0; d < hd; ++d) s += q[d] * k[d];
          p[j] = s * scale;
          if (p[j] > mx) mx = p[j];
        }
        T sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) { p[j] = std::exp(p[j] - mx); sum += p[j]; }
        for (std::int64_t j = 0; j <= i; ++j) p[j] /= sum;
        for (std::int64_t j = i + 1; j < Tn; ++j) p[j] = 0;
        T* o = out + (b * Tn + i) * C + h * hd;
        for (std::int64_t d = 0; d < hd; ++d) {
          T s = 0;
          for (std::int64_t j = 0; j <= i; ++j) s += p[j] * qkv[(b * Tn + j) * 3 * C + 2 * C + h * hd + d];
          o[d] = s;
        }
      }
}

template <typename T>
void attention_backward(T* dqkv, const T* dout, const T* qkv, const T* att, std::int64_t B,
                        std::int64_t Tn, std::int64_t C, std::int64_t NH) {
  const std::int64_t hd = C / NH;
  const T scale = T(1) / std::sqrt(T(hd));
  for (std::int64_t i = 0; i < B * Tn * 3 * C; ++i) dqkv[i] = 0;
  std::vector<T> dp(static_cast<std::size_t>(Tn));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < NH; ++h)
      for (std::int64_t i = 0; i < Tn; ++i) {
        const T* p = att + ((b * NH + h) * Tn + i) * Tn;
        const T* dy = dout + (b * Tn + i) * C + h * hd;
        T dot = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          const T* v = qkv + (b * Tn + j) * 3 * C + 2 * C + h * hd;
          T* dv = dqkv + (b * Tn + j) * 3 * C + 2 * C + h * hd;
          T s = 0;
          for (std::int64_t d = 0; d < hd; ++d) { s += dy[d] * v[d]; dv[d] += p[j] * dy[d]; }
          dp[std::size_t(j)] = s;
          dot += s * p[j];
        }
        const T* q = qkv + (b * Tn + i) * 3 * C + h * hd;
        T* dq = dqkv + (b * Tn + i) * 3 * C + h * hd;
        for (std::int64_t j = 0; j <= i; ++j) {
          const T ds = p[j] * (dp[std::size_t(j)] - dot) * scale;
          const T* k = qkv + (b * Tn + j) * 3 * C + C + h * hd;
          T* dk = dqkv + (b * Tn + j) * 3 * C + C + h * hd;
          for (std::int64_t d = 0; d < hd; ++d) { dq[d] += ds * k[d]; dk[d] += ds * q[d]; }
        }
      }
}

template <typename T>
void embedding_forward(T* out, const std::int32_t* tokens, const T* wte, const T* wpe,
                       std::int64_t B, std::int64_t Tn, std::int64_t C) {
  for (std::int64_t r = 0; r < B * Tn; ++r)
    for (std::int64_t c = 0; c < C; ++c)
      out[r * C + c] = wte[tokens[r] * C + c] + (wpe ? wpe[(r % Tn) * C + c] : T(0));
}

template <typename T>
void embedding_backward(T* dwte, T* dwpe, const T* dout, const std::int32_t* tokens,
                        std::int64_t B, std::int64_t Tn, std::int64_t C) {
  for (std::int64_t r = 0; r < B * Tn; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      dwte[tokens[r] * C + c] += dout[r * C + c];
      if (dwpe) dwpe[(r % Tn) * C + c] += dout[r * C + c];
    }
}

template <typename T>
T crossentropy_forward(T* lse, const T* logits, const std::int32_t* targets, std::int64_t N,
                       std::int64_t V) {
  T total = 0;
  for (std::int64_t r = 0; r < N; ++r) {
    const T* l = logits + r * V;
    T mx = l[0];
    for (std::int64_t j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
    T s = 0;
    for (std::int64_t j = 0; j < V; ++j) s += std::exp(l[j] - mx);
    lse[r] = mx + std::log(s);
    total += lse[r] - l[targets[r]];
  }
  return total / T(N);
}

template <typename T>
void crossentropy_backward(T* logits, const T* lse, const std::int32_t* targets, std::int64_t N,
                           std::int64_t V, T scale) {
  for (std::int64_t r = 0; r < N; ++r)
    for (std::int64_t j = 0; j < V; ++j)
      logits[r * V + j] = scale / T(N) * (std::exp(logits[r * V + j] - lse[r]) - (j == targets[r] ? T(1) : T(0)));
}

}  // namespace ds::nn::ref
