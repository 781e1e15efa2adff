// CUDA versions of the optimizer kernels (src/*_cuda.cu; built only when DS_HAVE_CUDA, and
// then DS_OPTIM_HAVE_CUDA is defined). Same hyperparameter structs and element math as
// ds/optim/kernels.h, on DEVICE pointers (p, state, g.data, w.data); they enqueue on `stream`
// and never synchronise with the host.
//
// One launch covers the whole flat range, i.e. every parameter tensor at once
// (multi-tensor); each thread handles 8 elements per iteration with 128-bit loads when all
// pointers are 16-byte aligned, else element by element; grid-stride loops; the tail past
// the last full group of 8 is guarded.
//
// Device-side step control (the fp16 step needs no host sync), every pointer optional:
//   d_skip:        if non-null and *d_skip != 0 the kernel returns without touching anything
//                  (the overflow decision made on the device, ds/precision/cuda_kernels.h)
//   d_grad_scale:  if non-null, gradients are multiplied by h.grad_scale * (*d_grad_scale)
//                  (1/loss_scale x clip coefficient computed on the device)
//   d_step:        if non-null, the 1-based step count is read from the device (the scaler
//                  prologue increments it only on successful steps) and the step-dependent
//                  scalars are recomputed from it: Adam's bc1/bc2 (when bias_correction),
//                  Lamb's step_size from `lr`, Adagrad's clr from `lr` and `lr_decay`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "ds/core/buffer.h"
#include "ds/optim/kernels.h"

namespace ds::optim::cuda {

struct DeviceStepControl {
  const int* d_skip = nullptr;
  const float* d_grad_scale = nullptr;
  const std::int64_t* d_step = nullptr;
  // Only read when d_step is set:
  bool bias_correction = true;  // Adam, Lamb
  float lr = 0.f;               // Lamb, Adagrad
  float lr_decay = 0.f;         // Adagrad
};

void adam(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h,
          const DeviceStepControl& ctl, cudaStream_t stream);
void sgd(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h,
         const DeviceStepControl& ctl, cudaStream_t stream);
void adagrad(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h,
             const DeviceStepControl& ctl, cudaStream_t stream);

// Lamb's per-segment layout on the device: chunks of <= 32 Ki elements that never cross a
// segment, and the scratch for the per-chunk norms. Build once per layout (one H2D copy).
class LambPlan {
 public:
  LambPlan(std::span<const Segment> segments, std::size_t n);  // empty segments: one [0, n)
  ~LambPlan();
  LambPlan(const LambPlan&) = delete;
  LambPlan& operator=(const LambPlan&) = delete;
  std::size_t num_segments() const { return nseg_; }
  std::size_t num_chunks() const { return nchunk_; }
  // Device array of the trust ratios of the last lamb() call, one float per segment.
  const float* d_coeffs() const { return d_coeffs_; }

 private:
  friend void lamb(float*, float*, float*, TensorView, TensorView, std::size_t, const LambPlan&, const LambHyper&,
                   const DeviceStepControl&, cudaStream_t);
  std::size_t n_ = 0, nseg_ = 0, nchunk_ = 0;
  void* d_chunks_ = nullptr;         // {seg, lo, hi} per chunk
  std::uint32_t* d_seg_first_ = nullptr;  // first chunk of each segment, nseg+1 entries
  double* d_partials_ = nullptr;     // 2 per chunk
  float* d_coeffs_ = nullptr;        // 1 per segment
};

void lamb(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const LambPlan& plan,
          const LambHyper& h, const DeviceStepControl& ctl, cudaStream_t stream);

}  // namespace ds::optim::cuda
