#include "ds/precision/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "ds/core/error.h"
#include "ds/core/log.h"

namespace ds::precision {

LossScaler::LossScaler(const LossScalerConfig& cfg) : cfg_(cfg) {
  if (cfg_.dynamic) {
    DS_CHECK(cfg_.initial_scale_power >= 0 && cfg_.initial_scale_power <= 127,
             "fp16.initial_scale_power must be in [0, 127], got " << cfg_.initial_scale_power);
    DS_CHECK(cfg_.window > 0, "fp16.loss_scale_window must be > 0, got " << cfg_.window);
    DS_CHECK(cfg_.hysteresis >= 1, "fp16.hysteresis must be >= 1, got " << cfg_.hysteresis);
    DS_CHECK(cfg_.min_scale > 0 && std::isfinite(cfg_.min_scale),
             "fp16.min_loss_scale must be a positive number, got " << cfg_.min_scale);
    state_.cur_scale = std::ldexp(1.0, cfg_.initial_scale_power);
    DS_CHECK(state_.cur_scale >= cfg_.min_scale,
             "fp16.min_loss_scale " << cfg_.min_scale << " exceeds the initial scale 2^"
                                    << cfg_.initial_scale_power << "; lower min_loss_scale or raise initial_scale_power");
  } else {
    DS_CHECK(cfg_.static_scale > 0 && std::isfinite(cfg_.static_scale),
             "fp16.loss_scale must be 0 (dynamic) or a positive number, got " << cfg_.static_scale);
    state_.cur_scale = cfg_.static_scale;
  }
  state_.cur_hysteresis = cfg_.hysteresis;
}

bool LossScaler::at_min_scale() const {
  return cfg_.dynamic && state_.cur_scale == cfg_.min_scale &&
         (cfg_.hysteresis == 1 || state_.cur_hysteresis == 1);
}

bool LossScaler::update(bool overflow) {
  LossScalerState& s = state_;
  if (overflow) ++s.consecutive_overflows; else s.consecutive_overflows = 0;
  if (!cfg_.dynamic) {
    ++s.cur_iter;
    if (overflow) s.last_overflow_iter = s.cur_iter - 1;
    return overflow;
  }
  if (overflow) {
    if (cfg_.hysteresis == 1 || s.cur_hysteresis == 1) {
      if (s.cur_scale == cfg_.min_scale && cfg_.raise_at_min_scale) {
        DS_THROW("loss scale stuck at fp16.min_loss_scale " << cfg_.min_scale << " after "
                 << s.consecutive_overflows << " consecutive overflowing steps: the model produces "
                 "inf/NaN gradients; lower the lr, enable gradient_clipping, check the data, or use bf16");
      }
      const double prev = s.cur_scale;
      s.cur_scale = std::max(s.cur_scale / 2.0, cfg_.min_scale);
      DS_INFO("OVERFLOW! Skipping step. Attempted loss scale: " << prev << ", reducing to " << s.cur_scale);
    } else {
      DS_INFO("OVERFLOW! Skipping step. Attempted loss scale: " << s.cur_scale << ", but hysteresis is "
              << s.cur_hysteresis << ". Reducing hysteresis to " << s.cur_hysteresis - 1);
      s.cur_hysteresis -= 1;
    }
    s.last_overflow_iter = s.cur_iter;
  } else {
    if (cfg_.consecutive_hysteresis) s.cur_hysteresis = cfg_.hysteresis;
    const std::int64_t stable = s.cur_iter - s.last_overflow_iter - 1;
    if (stable > 0 && stable % cfg_.window == 0) {
      if (!cfg_.consecutive_hysteresis) s.cur_hysteresis = cfg_.hysteresis;
      s.cur_scale *= 2.0;
    }
  }
  ++s.cur_iter;
  return overflow;
}

void LossScaler::set_state(const LossScalerState& st) {
  DS_CHECK(st.cur_scale > 0 && std::isfinite(st.cur_scale),
           "checkpoint loss scaler state: cur_scale must be a positive number, got " << st.cur_scale);
  DS_CHECK(st.cur_iter >= 0 && st.last_overflow_iter >= -1 && st.last_overflow_iter < st.cur_iter + 1,
           "checkpoint loss scaler state: cur_iter " << st.cur_iter << " / last_overflow_iter "
                                                     << st.last_overflow_iter << " are inconsistent");
  DS_CHECK(st.cur_hysteresis >= 0, "checkpoint loss scaler state: cur_hysteresis must be >= 0, got " << st.cur_hysteresis);
  state_ = st;
  if (!cfg_.dynamic) state_.cur_scale = cfg_.static_scale;  // a static scale comes from the config
}

}  // namespace ds::precision
