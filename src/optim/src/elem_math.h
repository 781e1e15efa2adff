// Per-element optimizer math, shared by the CPU references, the CPU fast kernels' plain
// fallback and the CUDA kernels (host + device). Private header.
// Rounding contract: every operation is one IEEE fp32 op (fmaf: one correctly rounded fused
// multiply-add) in the order written -- the C++ sources are compiled with -ffp-contract=off
// and the CUDA sources with --fmad=false, so nothing else gets fused, and sqrtf / division
// are correctly rounded everywhere: all versions (reference, AVX-512, CUDA) agree bit for bit.
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
  float omb1, omb2, neg_lr_wd, step, rbc2;
};
DS_HD inline AdamDerived adam_derived(const AdamHyper& h) {
  AdamDerived d;
  d.omb1 = 1.0f - h.beta1;
  d.omb2 = 1.0f - h.beta2;
  d.neg_lr_wd = h.adam_w_mode ? -(h.lr * h.weight_decay) : 0.0f;
  d.step = -(h.lr / h.bc1);
  d.rbc2 = 1.0f / sqrtf(h.bc2);
  return d;
}

// DeepSpeedCPUAdam's operation sequence (cpu_adam_impl.cpp, SIMD_FMA = fused multiply-add).
DS_HD inline float adam_elem(float g, float& m, float& v, float p, const AdamHyper& h, const AdamDerived& d) {
  g = g * h.grad_scale;
  if (!h.adam_w_mode) g = fmaf(p, h.weight_decay, g);  // L2: g += wd*p
  m = fmaf(g, d.omb1, m * h.beta1);
  v = fmaf(g * g, d.omb2, v * h.beta2);
  p = fmaf(p, d.neg_lr_wd, p);                          // AdamW: p -= lr*wd*p (old p)
  const float denom = fmaf(sqrtf(v), d.rbc2, h.eps);
  return fmaf(m / denom, d.step, p);
}

// torch.optim.SGD's sequence (its add(alpha) kernels are fused multiply-adds).
DS_HD inline float sgd_elem(float g, float* buf, float p, const SgdHyper& h) {
  g = g * h.grad_scale;
  g = fmaf(p, h.weight_decay, g);
  if (buf != nullptr) {
    const float b = h.first_step ? g : fmaf(g, 1.0f - h.dampening, *buf * h.momentum);
    *buf = b;
    g = h.nesterov ? fmaf(b, h.momentum, g) : b;
  }
  return fmaf(g, -h.lr, p);
}

DS_HD inline float adagrad_elem(float g, float& s, float p, const AdagradHyper& h) {
  g = g * h.grad_scale;
  g = fmaf(p, h.weight_decay, g);
  s = fmaf(g, g, s);
  const float stdv = sqrtf(s) + h.eps;
  return fmaf(g / stdv, -h.clr, p);
}

// Lamb phase 1: moments (as Adam), and the update direction u (un-bias-corrected).
DS_HD inline void lamb_moments(float g, float& m, float& v, const LambHyper& h) {
  g = g * h.grad_scale;
  m = fmaf(g, 1.0f - h.beta1, m * h.beta1);
  v = fmaf(g * g, 1.0f - h.beta2, v * h.beta2);
}
DS_HD inline float lamb_update_dir(float m, float v, float p, const LambHyper& h) {
  const float denom = h.eps_inside_sqrt ? sqrtf(v + h.eps) : sqrtf(v) + h.eps;
  return fmaf(p, h.weight_decay, m / denom);
}
// Phase 2: p -= (step_size*c) * u.
DS_HD inline float lamb_apply(float p, float u, float sc) { return fmaf(u, -sc, p); }

}  // namespace ds::optim::detail
