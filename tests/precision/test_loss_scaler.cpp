// DeepSpeed's DynamicLossScaler state machine on scripted overflow sequences
// (runtime/fp16/loss_scaler.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/precision/loss_scaler.h"

using ds::precision::LossScaler;
using ds::precision::LossScalerConfig;

namespace {

LossScalerConfig dyn(int power, std::int64_t window, int hysteresis, double min_scale = 1.0, bool consecutive = false) {
  LossScalerConfig c;
  c.dynamic = true;
  c.initial_scale_power = power;
  c.window = window;
  c.hysteresis = hysteresis;
  c.min_scale = min_scale;
  c.consecutive_hysteresis = consecutive;
  return c;
}

// Straight transcription of DeepSpeed's update_scale (loss_scaler.py), the yardstick for
// long random sequences.
struct PyScaler {
  double cur_scale; std::int64_t cur_iter = 0, last_overflow_iter = -1; int cur_hysteresis, delayed_shift;
  std::int64_t window; double min_scale; bool consecutive;
  bool update(bool overflow) {  // returns false when DeepSpeed would raise
    if (overflow) {
      if (delayed_shift == 1 || cur_hysteresis == 1) {
        if (cur_scale == min_scale) return false;
        cur_scale = std::max(cur_scale / 2, min_scale);
      } else {
        cur_hysteresis -= 1;
      }
      last_overflow_iter = cur_iter;
    } else {
      if (consecutive) cur_hysteresis = delayed_shift;
      const std::int64_t stable = (cur_iter - last_overflow_iter) - 1;  // stable_interval
      if (stable > 0 && stable % window == 0) {
        if (!consecutive) cur_hysteresis = delayed_shift;
        cur_scale *= 2;
      }
    }
    cur_iter += 1;
    return true;
  }
};

}  // namespace

TEST(LossScaler, WorkedTraceFromTheSpec) {
  // init 16, W=3, hysteresis 2, min 1; flags 0,0,0,0,0,0,0,1,1,1,0,1,0,0,0,0.
  LossScaler s(dyn(4, 3, 2));
  const std::vector<int> flags = {0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 0, 0, 0, 0};
  // Scale after each update (step 3 grows to 32, step 6 to 64, 7: hysteresis 2->1, 8: 32,
  // 9: 16, 11: 8, 15: 16 with the hysteresis refilled).
  const std::vector<double> after = {16, 16, 16, 32, 32, 32, 64, 64, 32, 16, 16, 8, 8, 8, 8, 16};
  const std::vector<int> hyst = {2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 2};
  for (std::size_t k = 0; k < flags.size(); ++k) {
    EXPECT_EQ(s.update(flags[k] != 0), flags[k] != 0) << "step " << k;
    EXPECT_EQ(s.scale(), after[k]) << "step " << k;
    EXPECT_EQ(s.state().cur_hysteresis, hyst[k]) << "step " << k;
  }
  EXPECT_EQ(s.state().cur_iter, 16);
  EXPECT_EQ(s.state().last_overflow_iter, 11);
}

TEST(LossScaler, DefaultsStartAt2Pow16) {
  LossScalerConfig c;  // dynamic defaults: 2^16, window 1000, hysteresis 2
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 65536.0);
  for (int i = 0; i < 1000; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 65536.0);  // grows on the (W+1)-th clean step
  s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  for (int i = 0; i < 999; ++i) s.update(false);
  EXPECT_EQ(s.scale(), 131072.0);
  s.update(false);
  EXPECT_EQ(s.scale(), 262144.0);  // then every W clean steps
}

TEST(LossScaler, ConsecutiveHysteresisRefillsOnEveryCleanStep) {
  LossScaler plain(dyn(8, 100, 2)), consec(dyn(8, 100, 2, 1.0, true));
  for (bool ov : {true, false, true}) { plain.update(ov); consec.update(ov); }
  EXPECT_EQ(plain.scale(), 128.0);   // 2->1 then halves (no refill on the clean step)
  EXPECT_EQ(consec.scale(), 256.0);  // refilled to 2 by the clean step: only 2->1 again
  EXPECT_EQ(consec.state().cur_hysteresis, 1);
}

TEST(LossScaler, HysteresisOneHalvesImmediatelyAndMinIsAFloor) {
  LossScaler s(dyn(3, 1000, 1, 2.0));
  s.update(true);
  EXPECT_EQ(s.scale(), 4.0);
  s.update(true);
  EXPECT_EQ(s.scale(), 2.0);
  EXPECT_TRUE(s.at_min_scale());
  EXPECT_EQ(s.consecutive_overflows(), 2);
}

TEST(LossScaler, StuckAtMinimumThrowsNamingTheRemedy) {
  LossScaler s(dyn(2, 1000, 1));
  s.update(true);  // 4 -> 2
  s.update(true);  // 2 -> 1
  try {
    s.update(true);
    FAIL() << "expected ds::Error";
  } catch (const ds::Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("min_loss_scale"), std::string::npos) << w;
    EXPECT_NE(w.find("3 consecutive"), std::string::npos) << w;
    EXPECT_NE(w.find("bf16"), std::string::npos) << w;
    EXPECT_NE(w.find("gradient_clipping"), std::string::npos) << w;
  }
}

TEST(LossScaler, NoRaiseKeepsTheMinimum) {
  LossScalerConfig c = dyn(1, 1000, 1);
  c.raise_at_min_scale = false;
  LossScaler s(c);
  for (int i = 0; i < 5; ++i) s.update(true);
  EXPECT_EQ(s.scale(), 1.0);
}

TEST(LossScaler, StaticScaleIsConstantAndOverflowStillSkips) {
  LossScaler s(LossScalerConfig::fixed(128.0));
  EXPECT_FALSE(s.dynamic());
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.update(i % 3 == 0), i % 3 == 0);
  EXPECT_EQ(s.scale(), 128.0);
  LossScaler none;  // bf16 / fp32
  EXPECT_EQ(none.scale(), 1.0);
}

TEST(LossScaler, MatchesDeepSpeedTranscriptionOnRandomSequences) {
  std::uint64_t x = 88172645463325252ull;
  auto rnd = [&] { x ^= x << 13; x ^= x >> 7; x ^= x << 17; return x; };
  for (int trial = 0; trial < 40; ++trial) {
    const int power = 10 + int(rnd() % 8), hyst = 1 + int(rnd() % 3);
    const std::int64_t window = 1 + std::int64_t(rnd() % 6);
    const bool consec = rnd() % 2;
    LossScalerConfig c = dyn(power, window, hyst, 1.0, consec);
    LossScaler s(c);
    PyScaler py{std::ldexp(1.0, power), 0, -1, hyst, hyst, window, 1.0, consec};
    const int p_over = 1 + int(rnd() % 4);  // overflow probability 1/(p_over+1)
    for (int k = 0; k < 300; ++k) {
      const bool ov = rnd() % std::uint64_t(p_over + 1) == 0;
      const bool ok = py.update(ov);
      if (!ok) { EXPECT_THROW(s.update(ov), ds::Error); break; }
      s.update(ov);
      ASSERT_EQ(s.scale(), py.cur_scale) << "trial " << trial << " step " << k;
      ASSERT_EQ(s.state().cur_hysteresis, py.cur_hysteresis) << "trial " << trial << " step " << k;
      ASSERT_EQ(s.state().last_overflow_iter, py.last_overflow_iter);
    }
  }
}

TEST(LossScaler, StateRoundTripContinuesIdentically) {
  const std::vector<int> flags = {0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0};
  LossScaler a(dyn(6, 3, 2));
  for (std::size_t k = 0; k < 9; ++k) a.update(flags[k]);
  LossScaler b(dyn(6, 3, 2));
  b.set_state(a.state());
  for (std::size_t k = 9; k < flags.size(); ++k) {
    a.update(flags[k]);
    b.update(flags[k]);
    EXPECT_EQ(a.scale(), b.scale());
    EXPECT_EQ(a.state().cur_iter, b.state().cur_iter);
  }
}

TEST(LossScaler, BadConfigNamesTheKey) {
  auto msg = [](LossScalerConfig c) {
    try { LossScaler s(c); } catch (const ds::Error& e) { return std::string(e.what()); }
    return std::string();
  };
  EXPECT_NE(msg(dyn(16, 0, 2)).find("fp16.loss_scale_window"), std::string::npos);
  EXPECT_NE(msg(dyn(16, 10, 0)).find("fp16.hysteresis"), std::string::npos);
  EXPECT_NE(msg(dyn(16, 10, 2, -1.0)).find("fp16.min_loss_scale"), std::string::npos);
  EXPECT_NE(msg(dyn(-1, 10, 2)).find("fp16.initial_scale_power"), std::string::npos);
  EXPECT_NE(msg(LossScalerConfig::fixed(-3)).find("fp16.loss_scale"), std::string::npos);
}
