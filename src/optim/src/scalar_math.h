// Per-element optimizer math shared by the references and the fast kernels' plain fallback.
// Private header. Compiled with -ffp-contract=off (CMakeLists) so no FMA changes rounding:
// the AVX-512 kernels perform the same IEEE operations in the same order, bit for bit.
#pragma once

#include <cmath>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/optim/kernels.h"

namespace ds::optim::detail {

inline float load_grad(const TensorView& g, std::size_t i) {
  switch (g.dtype) {
    case DType::F16: return f16_to_float(g.as<const f16>()[i]);
    case DType::BF16: return bf16_to_float(g.as<const bf16>()[i]);
    default: return g.as<const float>()[i];
  }
}

inline void store_working(const TensorView& w, std::size_t i, float x) {
  switch (w.dtype) {
    case DType::F16: w.as<f16>()[i] = float_to_f16(x); break;
    case DType::BF16: w.as<bf16>()[i] = float_to_bf16(x); break;
    default: w.as<float>()[i] = x; break;
  }
}

inline void check_views(const TensorView& g, const TensorView& w, std::size_t n, const char* who) {
  DS_CHECK(g.dtype == DType::F32 || g.dtype == DType::F16 || g.dtype == DType::BF16,
           who << ": gradient dtype must be fp32, fp16 or bf16, got " << dtype_name(g.dtype));
  DS_CHECK(g.count >= n && (g.data != nullptr || n == 0),
           who << ": gradient view holds " << g.count << " elements, the step needs " << n);
  if (w.data != nullptr) {
    DS_CHECK(w.dtype == DType::F32 || w.dtype == DType::F16 || w.dtype == DType::BF16,
             who << ": working dtype must be fp32, fp16 or bf16, got " << dtype_name(w.dtype));
    DS_CHECK(w.count >= n, who << ": working view holds " << w.count << " elements, the step needs " << n);
  }
}

// Scalars derived once per step, identically for every kernel.
struct AdamDerived {
  float omb1, omb2, decay, step, rbc2;
};
inline AdamDerived adam_derived(const AdamHyper& h) {
  AdamDerived d;
  d.omb1 = 1.0f - h.beta1;
  d.omb2 = 1.0f - h.beta2;
  d.decay = h.adam_w_mode ? 1.0f - h.lr * h.weight_decay : 1.0f;
  d.step = -(h.lr / h.bc1);
  d.rbc2 = 1.0f / std::sqrt(h.bc2);
  return d;
}

inline float adam_elem(float g, float& m, float& v, float p, const AdamHyper& h, const AdamDerived& d) {
  g = g * h.grad_scale;
  if (!h.adam_w_mode) g = g + h.weight_decay * p;
  m = h.beta1 * m + d.omb1 * g;
  v = h.beta2 * v + d.omb2 * g * g;
  p = p * d.decay;
  const float denom = std::sqrt(v) * d.rbc2 + h.eps;
  return p + d.step * (m / denom);
}

inline float sgd_elem(float g, float* buf, float p, const SgdHyper& h) {
  g = g * h.grad_scale;
  g = g + h.weight_decay * p;
  if (buf != nullptr) {
    float b = h.first_step ? g : h.momentum * *buf + (1.0f - h.dampening) * g;
    *buf = b;
    g = h.nesterov ? g + h.momentum * b : b;
  }
  return p - h.lr * g;
}

inline float adagrad_elem(float g, float& s, float p, const AdagradHyper& h) {
  g = g * h.grad_scale;
  g = g + h.weight_decay * p;
  s = s + g * g;
  const float stdv = std::sqrt(s) + h.eps;
  return p - h.clr * (g / stdv);
}

// Lamb phase 1: moments, and the update direction u (un-bias-corrected).
inline float lamb_update_dir(float m, float v, float p, const LambHyper& h) {
  const float denom = h.eps_inside_sqrt ? std::sqrt(v + h.eps) : std::sqrt(v) + h.eps;
  return m / denom + h.weight_decay * p;
}
inline void lamb_moments(float g, float& m, float& v, const LambHyper& h) {
  g = g * h.grad_scale;
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  m = h.beta1 * m + omb1 * g;
  v = h.beta2 * v + omb2 * g * g;
}

inline void check_segments(std::span<const Segment> segs, std::size_t n, const char* who) {
  std::size_t end = 0;
  for (const Segment& s : segs) {
    DS_CHECK(s.offset >= end && s.offset + s.count <= n,
             who << ": segments must be sorted, disjoint and within the " << n
                 << " elements; got segment [" << s.offset << ", " << s.offset + s.count << ")");
    end = s.offset + s.count;
  }
}

}  // namespace ds::optim::detail
