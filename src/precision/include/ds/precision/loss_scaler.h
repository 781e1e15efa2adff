// Loss scaling for fp16 training: DeepSpeed's DynamicLossScaler (ZeRO path,
// runtime/fp16/loss_scaler.py) and the static scaler.
//
// Call order per optimizer-step attempt (at the gradient-accumulation boundary):
//   s = scaler.scale();            // backward used s (the loss was multiplied by it)
//   overflow = <inf/NaN in the reduced gradients>;
//   scaler.update(overflow);       // exactly once per attempt, overflow or not
//   if (!overflow) optimizer step with grads multiplied by 1/s   <- the scale backward used
// Deliberate difference from DeepSpeed: DeepSpeed unscales by the scale *after* update(),
// so on a growth step the update is half-sized (DeepSpeed issue #2686); we unscale by `s`.
#pragma once

#include <cstdint>
#include <string>

namespace ds::precision {

struct LossScalerConfig {
  bool dynamic = true;               // false: static scale `static_scale`
  double static_scale = 1.0;         // fp16.loss_scale when > 0; 1.0 for bf16 / fp32
  int initial_scale_power = 16;      // dynamic: initial scale 2^initial_scale_power
  std::int64_t window = 1000;        // fp16.loss_scale_window
  int hysteresis = 2;                // fp16.hysteresis (DeepSpeed's delayed_shift)
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;            // fp16.min_loss_scale
  bool raise_at_min_scale = true;    // DeepSpeed's raise_error_at_min_scale (ZeRO path)

  // Static scale 1: bf16 and fp32 training.
  static LossScalerConfig none() { LossScalerConfig c; c.dynamic = false; c.static_scale = 1.0; return c; }
  static LossScalerConfig fixed(double scale) { LossScalerConfig c; c.dynamic = false; c.static_scale = scale; return c; }
};

// What a checkpoint stores (DeepSpeed pickles the whole scaler under "loss_scaler").
struct LossScalerState {
  double cur_scale = 1.0;
  std::int64_t cur_iter = 0;
  std::int64_t last_overflow_iter = -1;
  int cur_hysteresis = 1;
  std::int64_t consecutive_overflows = 0;  // dstrain: for the "stuck at minimum" message
};

class LossScaler {
 public:
  // Validates the config (errors name fp16.<key>).
  explicit LossScaler(const LossScalerConfig& cfg = LossScalerConfig::none());

  // The scale backward must multiply the loss by for the next micro-batches.
  double scale() const { return state_.cur_scale; }
  bool dynamic() const { return cfg_.dynamic; }
  const LossScalerConfig& config() const { return cfg_; }

  // DeepSpeed's update_scale(overflow), once per step attempt. Dynamic mode:
  //  overflow: if hysteresis is exhausted (delayed_shift == 1 or cur_hysteresis == 1) the
  //    scale halves (not below min_scale) -- and if it is already at min_scale, throws
  //    ds::Error naming the remedy (raise_at_min_scale); otherwise cur_hysteresis -= 1.
  //    last_overflow_iter = cur_iter.
  //  clean: consecutive_hysteresis refills the hysteresis; stable = cur_iter -
  //    last_overflow_iter - 1; stable > 0 && stable % window == 0 -> scale *= 2 (and the
  //    hysteresis refills when not consecutive). No upper bound.
  //  cur_iter += 1 always. Static mode: only counts (the caller still skips overflowed steps).
  // Returns true when the step must be skipped (== overflow).
  bool update(bool overflow);

  // True when the scale sits at min_scale and hysteresis is exhausted: one more overflow throws.
  bool at_min_scale() const;
  std::int64_t consecutive_overflows() const { return state_.consecutive_overflows; }

  LossScalerState state() const { return state_; }
  void set_state(const LossScalerState& s);

 private:
  LossScalerConfig cfg_;
  LossScalerState state_;
};

}  // namespace ds::precision
