// The boundary step's decision (docs/dev/engine.md "The boundary step"): from the gradient
// statistics agreed across ranks, whether the optimizer step is skipped, the global grad
// norm and the one grad_scale the optimizer multiplies every gradient by.
//
// ONE function for both paths: the engine calls it on the host with the statistics a host
// all-reduce returned, and the device stores call it inside a one-thread kernel
// (precision::cuda::decide_step) with the statistics a device all-reduce left in device
// memory. The same IEEE double operations in the same order on both (sqrt and division are
// correctly rounded in CUDA's double arithmetic, and there is no a*b+c a compiler could fuse),
// so the GPU path skips, clips and scales exactly as the host path.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define DS_STEP_HD __host__ __device__
#else
#define DS_STEP_HD
#endif

namespace ds::precision {

// What the decision needs that the host knows when it launches the step. Plain values (a
// kernel argument).
struct StepInputs {
  double used_scale = 1.0;    // the loss scale backward multiplied by
  double post = 1.0;          // the reducer's post factor (gradient averaging), applied by the optimizer
  double clip = 0.0;          // gradient_clipping (<= 0: none)
  int world = 1;              // data-parallel ranks (the mean loss divides by it)
  int partitioned = 0;        // ZeRO >= 1: the sum of squares is summed over ranks; stage 0: each
                              // rank's own (every rank holds the whole reduced gradients)
  int grads_can_skip = 1;     // inf/NaN gradients skip the step (0: bf16 without check_grad_overflow)
  int loss_nonfinite = 0;     // this rank's cycle saw a non-finite loss (the host knows it)
  double loss_mean = 0.0;     // this rank's mean loss over its cycle (0 when it had none)
};

// The four values the ranks sum: this rank's sum of squares (0 when it saw inf/NaN), its
// inf/NaN flag, its non-finite-loss flag, its mean loss.
struct StepStats {
  double v[4];
};

DS_STEP_HD inline StepStats pack_step_stats(double sumsq, int found_inf, const StepInputs& in) {
  return StepStats{{found_inf ? 0.0 : sumsq, found_inf ? 1.0 : 0.0, in.loss_nonfinite ? 1.0 : 0.0, in.loss_mean}};
}

// The outcome the engine applies (counters, scaler, scheduler, progress line). Plain values:
// a device store copies it into pinned host memory.
struct StepDecision {
  double grad_norm = 0.0;   // unscaled, pre-clip; -1 when a rank saw inf/NaN gradients
  double grad_scale = 1.0;  // post / used_scale x clip coefficient (when not skipped)
  double mean_loss = 0.0;   // the ranks' mean losses, averaged
  int skip = 0;             // the optimizer step is skipped (overflow or non-finite loss)
  int grads_bad = 0;        // some rank saw inf/NaN gradients
  int loss_bad = 0;         // some rank saw a non-finite loss
  int pad = 0;
};

// red: the StepStats summed over ranks (this rank's own with one rank); own_sumsq /
// own_found_inf: this rank's statistics before the sum.
DS_STEP_HD inline StepDecision decide_step(const StepStats& red, double own_sumsq, int own_found_inf,
                                           const StepInputs& in) {
  StepDecision d;
  const double sumsq = in.partitioned ? red.v[0] : (own_found_inf ? 0.0 : own_sumsq);
  d.grads_bad = red.v[1] > 0 ? 1 : 0;
  d.loss_bad = red.v[2] > 0 ? 1 : 0;
  d.mean_loss = red.v[3] / in.world;
  d.grad_norm = d.grads_bad ? -1.0 : sqrt(sumsq) * in.post / in.used_scale;
  d.skip = ((d.grads_bad && in.grads_can_skip) || d.loss_bad) ? 1 : 0;
  // Clip as DeepSpeed's clip_grad_norm_: coef = 1 / max(1, (norm + 1e-6) / clip) on the
  // unscaled averaged gradients; 1/loss_scale, the averaging post-factor and the clip
  // coefficient fold into one grad_scale the optimizer applies in its single pass.
  double coef = 1.0;
  if (in.clip > 0) {
    const double f = (d.grad_norm + 1e-6) / in.clip;
    if (f > 1.0) coef = 1.0 / f;
  }
  d.grad_scale = d.skip ? 1.0 : in.post / in.used_scale * coef;
  return d;
}

}  // namespace ds::precision
