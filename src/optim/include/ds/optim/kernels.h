// The optimizer kernels behind ds::optim::Optimizer, callable directly (tests, benchmarks,
// a GPU engine). Each has a plain scalar reference (*_ref, src/*_ref.cpp) and a fast CPU
// version (*_cpu, src/*_cpu.cpp: AVX-512 when the CPU has it, else plain code; OpenMP
// threads) with the same signature; the CUDA versions (ds/optim/cuda_kernels.h) take the
// same hyperparameter structs on device pointers.
//
// Common arguments: n elements; p = fp32 master (updated in place); state arrays of n
// floats; g = gradient view (F32/F16/BF16, >= n elements), multiplied by h.grad_scale first;
// w = working copy (F32/F16/BF16) written with the new p, or w.data == nullptr for none.
// All math is fp32 with the operation order of src/elem_math.h (explicit FMAs, nothing else
// fused); *_cpu equals *_ref bitwise for adam, sgd and adagrad, and to ~1e-6 relative for
// lamb (its norms are summed in a different order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "ds/core/buffer.h"
#include "ds/optim/segment.h"

namespace ds::optim {

// Adam / AdamW, DeepSpeedCPUAdam's operation sequence (cpu_adam_impl.cpp; the same maths as
// FusedAdam, one sqrt and one division per element so the kernel stays memory-bound):
//   g = grad*grad_scale;  L2 mode (adam_w_mode false): g += wd*p
//   m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   AdamW mode: p += (-lr*wd)*p                       (decoupled decay, from the old p)
//   p += (-lr/bc1) * (m / (sqrt(v)*(1/sqrt(bc2)) + eps))
// i.e. eps outside the square root, after bias-correcting v. The exact fp32 operation order,
// fused multiply-adds included, is in src/elem_math.h.
struct AdamHyper {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  float bc1 = 1.f, bc2 = 1.f;  // 1 - beta^step, or 1 without bias correction
  bool adam_w_mode = true;
  float grad_scale = 1.f;
};
// torch.optim.SGD (1.13):
//   g = grad*grad_scale + wd*p;  momentum: b = first ? g : momentum*b + (1-dampening)*g;
//   g = nesterov ? g + momentum*b : b;   p -= lr*g
struct SgdHyper {
  float lr = 1e-3f, momentum = 0.f, dampening = 0.f, weight_decay = 0.f;
  bool nesterov = false;
  bool first_step = false;  // initialise the momentum buffer with g (torch: buf is None)
  float grad_scale = 1.f;
};
// torch.optim.Adagrad (1.13):
//   g = grad*grad_scale + wd*p;  s += g*g;  p -= clr * (g / (sqrt(s) + eps)),
//   clr = lr / (1 + (step-1)*lr_decay)
struct AdagradHyper {
  float clr = 1e-2f, eps = 1e-10f, weight_decay = 0.f;
  float grad_scale = 1.f;
};
// FusedLamb (fused_lamb_cuda_kernel.cu), per segment:
//   g = grad*grad_scale;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g
//   u = m / (sqrt(v) + eps) + wd*p        (eps_inside_sqrt: m / sqrt(v + eps) + wd*p)
//   c = ||p|| / ||u|| clamped to [min_coeff, max_coeff]; c = 1 when either norm is 0
//   p -= (step_size*c) * u,  step_size = lr*sqrt(bc2)/bc1 (lr without bias correction)
struct LambHyper {
  float step_size = 1e-3f, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0.f;
  float min_coeff = 0.01f, max_coeff = 10.f;
  bool eps_inside_sqrt = false;
  float grad_scale = 1.f;
};

void adam_ref(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h);
void adam_cpu(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h);
// buf may be null when h.momentum == 0.
void sgd_ref(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h);
void sgd_cpu(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h);
void adagrad_ref(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h);
void adagrad_cpu(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h);
// coeffs: one float per segment (the trust ratios used), may be empty.
void lamb_ref(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n,
              std::span<const Segment> segments, const LambHyper& h, std::span<float> coeffs);
void lamb_cpu(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n,
              std::span<const Segment> segments, const LambHyper& h, std::span<float> coeffs);

// The trust ratio from the two squared norms (shared by every Lamb implementation).
inline float lamb_trust_ratio(double p_sq, double u_sq, float min_coeff, float max_coeff) {
  if (p_sq <= 0.0 || u_sq <= 0.0) return 1.f;
  double c = __builtin_sqrt(p_sq) / __builtin_sqrt(u_sq);
  if (c > double(max_coeff)) c = max_coeff;
  if (c < double(min_coeff)) c = min_coeff;
  return float(c);
}

}  // namespace ds::optim
