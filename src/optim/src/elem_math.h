// Per-element optimizer math, shared by the CPU references, the CPU fast kernels' plain
// fallback and the CUDA kernels (host + device). Private header.
// Rounding contract: every operation is one IEEE fp32 op in the order written -- the C++
// sources are compiled with -ffp-contract=off and the CUDA sources with --fmad=false, and
// sqrtf / division are correctly rounded on both, so all versions agree bit for bit.
#pragma once

#include <math.h>

#include "ds/optim/kernels.h"

#if defined(__CUDACC__)
#define DS_HD __host__ __device__
#else
#define DS_HD
#endif

namespace ds::optim::detail {

// Scalars derived once per step, identically for every kernel.
struct AdamDerived {
  float omb1, omb2, decay, step, rbc2;
};
DS_HD inline AdamDerived adam_derived(const AdamHyper& h) {
  AdamDerived d;
  d.omb1 = 1.0f - h.beta1;
  d.omb2 = 1.0f - h.beta2;
  d.decay = h.adam_w_mode ? 1.0f - h.lr * h.weight_decay : 1.0f;
  d.step = -(h.lr / h.bc1);
  d.rbc2 = 1.0f / sqrtf(h.bc2);
  return d;
}

DS_HD inline float adam_elem(float g, float& m, float& v, float p, const AdamHyper& h, const AdamDerived& d) {
  g = g * h.grad_scale;
  if (!h.adam_w_mode) g = g + h.weight_decay * p;
  m = h.beta1 * m + d.omb1 * g;
  v = h.beta2 * v + d.omb2 * g * g;
  p = p * d.decay;
  const float denom = sqrtf(v) * d.rbc2 + h.eps;
  return p + d.step * (m / denom);
}

DS_HD inline float sgd_elem(float g, float* buf, float p, const SgdHyper& h) {
  g = g * h.grad_scale;
  g = g + h.weight_decay * p;
  if (buf != nullptr) {
    float b = h.first_step ? g : h.momentum * *buf + (1.0f - h.dampening) * g;
    *buf = b;
    g = h.nesterov ? g + h.momentum * b : b;
  }
  return p - h.lr * g;
}

DS_HD inline float adagrad_elem(float g, float& s, float p, const AdagradHyper& h) {
  g = g * h.grad_scale;
  g = g + h.weight_decay * p;
  s = s + g * g;
  const float stdv = sqrtf(s) + h.eps;
  return p - h.clr * (g / stdv);
}

// Lamb phase 1: moments, and the update direction u (un-bias-corrected).
DS_HD inline float lamb_update_dir(float m, float v, float p, const LambHyper& h) {
  const float denom = h.eps_inside_sqrt ? sqrtf(v + h.eps) : sqrtf(v) + h.eps;
  return m / denom + h.weight_decay * p;
}
DS_HD inline void lamb_moments(float g, float& m, float& v, const LambHyper& h) {
  g = g * h.grad_scale;
  const float omb1 = 1.0f - h.beta1, omb2 = 1.0f - h.beta2;
  m = h.beta1 * m + omb1 * g;
  v = h.beta2 * v + omb2 * g * g;
}

}  // namespace ds::optim::detail
