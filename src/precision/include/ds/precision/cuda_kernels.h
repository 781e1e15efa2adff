// CUDA versions of the precision kernels (src/precision_cuda.cu; built only when
// DS_HAVE_CUDA, and then DS_PRECISION_HAVE_CUDA is defined). Device pointers; everything is
// enqueued on `stream` and nothing synchronises with the host, so an fp16 step -- overflow
// check, loss-scale update, skip decision, clip coefficient -- runs without a host round trip:
//
//   cudaMemsetAsync(d_sumsq, 0) ; cudaMemsetAsync(d_found_inf, 0)
//   grad_stats(bucket_k, d_sumsq, d_found_inf)      for every gradient buffer
//   step_prologue(state, cfg, d_found_inf, d_sumsq, clip, d_skip, d_grad_scale, d_norm, d_step)
//   ds::optim::cuda::adam(..., {d_skip, d_grad_scale, d_step})   (returns at once when skipped)
//   cast_from_f32(master, working)   -- or fused into the optimizer (working view)
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ds/core/buffer.h"
#include "ds/precision/loss_scaler.h"
#include "ds/precision/step_decision.h"

namespace ds::precision::cuda {

// Adds sum_i g_i^2 (double, atomics: the last bits may vary run to run) to *d_sumsq and sets
// *d_found_inf = 1 when an element is inf or NaN. g: F32/F16/BF16. The caller zeroes both.
void grad_stats(TensorView g, double* d_sumsq, int* d_found_inf, cudaStream_t stream);

// In place, in g's own dtype: g_i = g_i * (*d_multiplier); *d_found_inf = 1 on a non-finite
// input element (torch's _amp_foreach_non_finite_check_and_unscale_).
void unscale_check(TensorView g, const float* d_multiplier, int* d_found_inf, cudaStream_t stream);

// dst = src converted (round to nearest even) to dst.dtype (F32/F16/BF16); dst.count elements.
void cast_from_f32(const float* src, TensorView dst, cudaStream_t stream);

// The scaler's state in device memory (same fields and meaning as LossScalerState).
struct DeviceScalerState {
  double cur_scale;
  std::int64_t cur_iter, last_overflow_iter, consecutive_overflows;
  int cur_hysteresis;
  int stuck;  // 1: an overflow arrived at min_loss_scale (the CPU LossScaler throws there)
};
DeviceScalerState to_device_state(const LossScalerState& s);
LossScalerState from_device_state(const DeviceScalerState& s);

// One thread, no host sync. With prev = cur_scale and skip = *d_found_inf != 0:
//   LossScaler::update(skip) on *state (dynamic or static, as cfg);
//   skip:  *d_skip = 1, *d_grad_norm = -1 (DeepSpeed masks inf/NaN norms with -1);
//   else:  norm = sqrt(*d_sumsq) / prev;  coef = clip > 0 ? min(1, clip / (norm + 1e-6)) : 1;
//          *d_grad_scale = coef / prev  (unscale by the scale backward USED, not DeepSpeed's
//          post-growth one); *d_grad_norm = norm; *d_skip = 0; *d_step += 1 (if d_step).
// At min_loss_scale with raise_at_min_scale it sets state->stuck = 1 and skips; the host
// reads the state when it logs and raises the same error as LossScaler.
void step_prologue(DeviceScalerState* state, const LossScalerConfig& cfg, const int* d_found_inf,
                   const double* d_sumsq, float clip, int* d_skip, float* d_grad_scale, float* d_grad_norm,
                   std::int64_t* d_step, cudaStream_t stream);

// The engine's boundary step without a host round trip (ds/precision/step_decision.h), one
// thread each:
// pack_step_stats: d_red[0..3] = pack_step_stats(*d_sumsq, *d_found_inf, in) -- the values
//   the ranks then sum on the stream (in carries the host's loss flag and mean loss).
// decide_step: *d_out = decide_step(d_red, *d_sumsq, *d_found_inf, in); *d_skip = its skip;
//   *d_grad_scale = float(its grad_scale) (the optimizer's DeviceStepControl; the host
//   grad_scale is then 1, so the kernel multiplies by exactly this float, as the host path
//   multiplies by float(grad_scale)).
void pack_step_stats(const double* d_sumsq, const int* d_found_inf, const StepInputs& in, double* d_red,
                     cudaStream_t stream);
void decide_step(const double* d_red, const double* d_sumsq, const int* d_found_inf, const StepInputs& in,
                 StepDecision* d_out, int* d_skip, float* d_grad_scale, cudaStream_t stream);

}  // namespace ds::precision::cuda
