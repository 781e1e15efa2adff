// One fused read of a gradient buffer: the sum of squares (for the global grad norm) and
// whether any element is inf or NaN (the fp16 overflow / bf16 bad-gradient check).
//
// grad_stats_ref is the plain scalar reference; grad_stats is the fast version (AVX-512
// when the CPU has it, else plain code; OpenMP threads) with the same signature.
// Both accumulate in double. The fast version sums fixed 16 Ki-element blocks and adds the
// block sums in order, so its result does not depend on the thread count; it may differ
// from the reference in the last bits (relative 1e-12 in the tests).
#pragma once

#include <cstddef>

#include "ds/core/buffer.h"

namespace ds::precision {

struct GradStats {
  // sum_i (multiplier * g_i)^2, computed as multiplier^2 * sum_i g_i^2 in double.
  // Meaningless (inf/NaN) when has_inf_or_nan.
  double sum_of_squares = 0.0;
  bool has_inf_or_nan = false;
};

// g: F32, F16 or BF16 (anything else throws ds::Error). multiplier: e.g. 1/loss_scale, so
// sqrt(sum_of_squares) is the unscaled norm of this buffer.
GradStats grad_stats_ref(TensorView g, double multiplier = 1.0);
GradStats grad_stats(TensorView g, double multiplier = 1.0);

// DeepSpeed's clip coefficient from the unscaled global norm (runtime/utils.py clip_grad_norm_):
// min(1, max_norm / (norm + 1e-6)); 1 when max_norm <= 0 (clipping off).
inline double clip_coefficient(double norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  const double c = max_norm / (norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace ds::precision
