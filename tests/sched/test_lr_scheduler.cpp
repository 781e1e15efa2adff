// DeepSpeed's LR schedulers against values computed with DeepSpeed's runtime/lr_schedules.py
// and against their formulas re-typed here.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <string>

#include "ds/core/error.h"
#include "ds/sched/lr_scheduler.h"

using ds::config::SchedulerConfig;
using ds::sched::make_scheduler;

namespace {

double lr_at(ds::sched::LrScheduler& s, std::int64_t it) {
  s.set_last_batch_iteration(it);
  return s.lr();
}

SchedulerConfig warmup(const std::string& type = "WarmupLR") {
  SchedulerConfig c;
  c.type = type;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 1e-3;
  c.warmup_num_steps = 1000;
  return c;
}

std::string error_of(const SchedulerConfig& c) {
  try { make_scheduler(c, 1e-3, {0.9, 0.999}); } catch (const ds::Error& e) { return e.what(); }
  return {};
}

}  // namespace

TEST(WarmupLR, SpecVectorsLog) {
  auto s = make_scheduler(warmup(), 0.5, {0.9, 0.999});
  EXPECT_EQ(s->name(), "WarmupLR");
  EXPECT_EQ(s->last_batch_iteration(), -1);
  EXPECT_EQ(s->lr(), 0.0);  // construction writes lr(it=-1) = min
  s->step();
  EXPECT_EQ(s->last_batch_iteration(), 0);
  EXPECT_EQ(s->lr(), 0.0);
  s->step();
  EXPECT_NEAR(s->lr(), 1.00343e-4, 1e-9);
  EXPECT_NEAR(lr_at(*s, 10), 3.47131e-4, 1e-9);
  EXPECT_NEAR(lr_at(*s, 999), 1e-3, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(*s, 5000), 1e-3);
}

TEST(WarmupLR, LinearAndDefaultMaxFromOptimizer) {
  SchedulerConfig c = warmup();
  c.warmup_type = "linear";
  auto s = make_scheduler(c, 0.5, {0.9, 0.999});
  EXPECT_DOUBLE_EQ(lr_at(*s, 1), 1e-6);
  c.warmup_max_lr.reset();  // None -> the optimizer's lr
  auto t = make_scheduler(c, 0.5, {0.9, 0.999});
  EXPECT_DOUBLE_EQ(lr_at(*t, 2000), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(*t, 500), 0.25);
}

TEST(WarmupLR, EngineConventionStepKUsesItKMinus2) {
  // The optimizer's k-th step applies the lr the scheduler holds before its (k-1)-th step().
  auto s = make_scheduler(warmup(), 0.5, {0.9, 0.999});
  auto ref = make_scheduler(warmup(), 0.5, {0.9, 0.999});
  for (int k = 1; k <= 30; ++k) {
    EXPECT_DOUBLE_EQ(s->lr(), lr_at(*ref, k - 2)) << "step " << k;
    s->step();  // after the successful step k
  }
}

TEST(WarmupLR, WarmupStepsValidatedAndRaisedToTwo) {
  SchedulerConfig c = warmup();
  c.warmup_num_steps = 0;
  EXPECT_NE(error_of(c).find("scheduler.params.warmup_num_steps"), std::string::npos) << error_of(c);
  c.warmup_num_steps = 1;  // raised to 2: log gamma = ln(it+1)/ln 2
  auto s = make_scheduler(c, 1.0, {0.9, 0.999});
  EXPECT_DOUBLE_EQ(lr_at(*s, 0), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(*s, 1), 1e-3);
}

TEST(WarmupDecayLR, SpecVectors) {
  SchedulerConfig c = warmup("WarmupDecayLR");
  c.total_num_steps = 2000;
  auto s = make_scheduler(c, 0.5, {0.9, 0.999});
  EXPECT_EQ(s->name(), "WarmupDecayLR");
  EXPECT_NEAR(lr_at(*s, 1), 1.00343e-4, 1e-9);  // same warmup
  EXPECT_DOUBLE_EQ(lr_at(*s, 1000), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(*s, 1500), 0.5e-3);
  EXPECT_DOUBLE_EQ(lr_at(*s, 2000), 0.0);
  EXPECT_DOUBLE_EQ(lr_at(*s, 2500), 0.0);
  c.warmup_max_lr.reset();  // WarmupDecayLR's own default 0.001 (not the optimizer's lr)
  auto t = make_scheduler(c, 0.5, {0.9, 0.999});
  EXPECT_DOUBLE_EQ(lr_at(*t, 1000), 1e-3);
  c.total_num_steps.reset();
  EXPECT_NE(error_of(c).find("scheduler.params.total_num_steps"), std::string::npos);
}

TEST(WarmupCosineLR, SpecVectors) {
  SchedulerConfig c;
  c.type = "WarmupCosineLR";
  c.total_num_steps = 2000;
  c.warmup_num_steps = 1000;
  auto s = make_scheduler(c, 2e-3, {0.9, 0.999});
  EXPECT_EQ(s->lr(), 0.0);  // it = -1: ratio 0
  EXPECT_NEAR(lr_at(*s, 1000) / 2e-3, 0.99999753, 1e-8);
  EXPECT_DOUBLE_EQ(lr_at(*s, 1999) / 2e-3, 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(*s, 3000) / 2e-3, 1e-4);
  // Warmup: ratio = wmin + (1-wmin)*ln(it+1)/ln(N)
  c.warmup_min_ratio = 0.1;
  auto t = make_scheduler(c, 2e-3, {0.9, 0.999});
  EXPECT_NEAR(lr_at(*t, 10), 2e-3 * (0.1 + 0.9 * std::log(11.0) / std::log(1000.0)), 1e-15);
  // After warmup: p = (it-N+1)/(total-N)
  const double p = (1500.0 - 1000 + 1) / 1000.0;
  EXPECT_NEAR(lr_at(*t, 1500), 2e-3 * (1e-4 + (1 - 1e-4) * (1 + std::cos(std::numbers::pi * p)) / 2), 1e-15);
}

TEST(OneCycle, SpecTableAndMomentum) {
  SchedulerConfig c;
  c.type = "OneCycle";
  c.cycle_min_lr = 1e-4;
  c.cycle_max_lr = 1e-3;
  c.cycle_first_step_size = 1000;
  auto s = make_scheduler(c, 1e-3, {0.9, 0.999});
  EXPECT_EQ(s->lr(), 1e-4);  // construction: min lr, betas (min_mom, 0.99)
  ASSERT_TRUE(s->betas());
  EXPECT_EQ((*s->betas())[0], 0.8);
  EXPECT_EQ((*s->betas())[1], 0.99);
  EXPECT_NEAR(lr_at(*s, 0), 1.009e-4, 1e-15);
  EXPECT_NEAR(lr_at(*s, 499), 5.5e-4, 1e-15);
  EXPECT_NEAR(lr_at(*s, 999), 1e-3, 1e-15);
  EXPECT_NEAR((*s->betas())[0], 0.8, 1e-12);  // momentum inverse to lr
  EXPECT_NEAR(lr_at(*s, 1499), 5.5e-4, 1e-15);
  EXPECT_NEAR((*s->betas())[0], 0.85, 1e-12);
  EXPECT_NEAR(lr_at(*s, 1999), 1e-4, 1e-15);
  EXPECT_NEAR(lr_at(*s, 5000), 1e-4, 1e-15);  // no decay configured: stays at min
  EXPECT_NEAR((*s->betas())[0], 0.9, 1e-12);
}

TEST(OneCycle, DecayPhaseAndNoMomentum) {
  SchedulerConfig c;
  c.type = "OneCycle";
  c.cycle_min_lr = 1e-4;
  c.cycle_max_lr = 1e-3;
  c.cycle_first_step_size = 100;
  c.cycle_second_step_size = 300;
  c.decay_step_size = 50;
  c.decay_lr_rate = 0.5;
  c.decay_mom_rate = 0.1;
  auto s = make_scheduler(c, 1e-3, {0.9, 0.999});
  EXPECT_NEAR(lr_at(*s, 99), 1e-3, 1e-15);  // peak after the first (shorter) half
  EXPECT_NEAR(lr_at(*s, 249), 1e-4 + 9e-4 * 0.5, 1e-15);
  EXPECT_NEAR(lr_at(*s, 449), 1e-4 / (1 + 0.5 * 50.0 / 50.0), 1e-15);  // d = it - 400 + 1 = 50
  EXPECT_NEAR((*s->betas())[0], 0.9 * (1 + 0.1 * 1.0), 1e-12);
  c.cycle_momentum = false;
  auto t = make_scheduler(c, 1e-3, {0.9, 0.999});
  EXPECT_FALSE(t->betas());
  c.cycle_first_step_size = 0;
  EXPECT_NE(error_of(c).find("scheduler.params.cycle_first_step_size"), std::string::npos);
}

// Stair counts quantise on the integer batch offset b = (it + 1) mod T within the cycle, as
// DeepSpeed does. Cycle 6 up + 9 down (T = 15), lr 1e-3 -> 5e-3, momentum 0.9 -> 0.8:
// the first half holds floor(b*2/6)/2 (stairs of 3 batches: scale 0, 0.5 from b = 3, 1 at
// b = 6), the second floor((15-b)*3/9)/3 (2/3 for b = 7..9, 1/3 for 10..12, 0 from 13).
// Each boundary is checked just before, at and after; the values are typed by hand.
namespace {
SchedulerConfig stairs_cycle() {
  SchedulerConfig c;
  c.type = "OneCycle";
  c.cycle_min_lr = 1e-3;
  c.cycle_max_lr = 5e-3;
  c.cycle_first_step_size = 6;
  c.cycle_second_step_size = 9;
  c.cycle_first_stair_count = 2;
  c.cycle_second_stair_count = 3;
  c.decay_step_size = 5;
  c.decay_lr_rate = 1.0;
  c.decay_mom_rate = 0.1;
  return c;
}
}  // namespace

TEST(OneCycle, StairCountsQuantiseOnTheBatchOffset) {
  auto s = make_scheduler(stairs_cycle(), 1e-3, {0.9, 0.999});
  struct Row { std::int64_t it; double lr, mom; };
  const Row rows[] = {
      {0, 1e-3, 0.9},          // b = 1: bottom stair (continuous would be 1/6 up)
      {1, 1e-3, 0.9},          // b = 2: just before the first stair
      {2, 3e-3, 0.85},         // b = 3: at it
      {3, 3e-3, 0.85},         // b = 4: after (continuous: 2/3)
      {4, 3e-3, 0.85},         // b = 5: just before the peak
      {5, 5e-3, 0.8},          // b = 6: the peak, the last batch of the first half
      {6, 11e-3 / 3, 0.9 - 0.2 / 3},  // b = 7: first stair down, scale 2/3 (continuous 8/9)
      {8, 11e-3 / 3, 0.9 - 0.2 / 3},  // b = 9: just before the next stair
      {9, 7e-3 / 3, 0.9 - 0.1 / 3},   // b = 10: at it, scale 1/3
      {10, 7e-3 / 3, 0.9 - 0.1 / 3},  // b = 11: after
      {11, 7e-3 / 3, 0.9 - 0.1 / 3},  // b = 12: just before the bottom stair
      {12, 1e-3, 0.9},         // b = 13: at it, scale 0 (continuous 2/9)
      {13, 1e-3, 0.9},         // b = 14: after
      {14, 1e-3, 0.9},         // b = 15 = T: offset 0, the cycle's last batch
      {15, 1e-3 / 1.2, 0.9 * 1.02},   // decay: d = 1, lr = min / (1 + 1 * 1/5), mom = max * (1 + 0.1/5)
      {19, 5e-4, 0.99},        // decay: d = 5
  };
  for (const Row& r : rows) {
    SCOPED_TRACE("it = " + std::to_string(r.it));
    EXPECT_NEAR(lr_at(*s, r.it), r.lr, 1e-15);
    ASSERT_TRUE(s->betas());
    EXPECT_NEAR((*s->betas())[0], r.mom, 1e-12);
    EXPECT_EQ((*s->betas())[1], 0.99);
  }
  // Stepping gives the same values as restoring each iteration.
  auto t = make_scheduler(stairs_cycle(), 1e-3, {0.9, 0.999});
  for (std::int64_t it = 0; it <= 19; ++it) {
    t->step();
    EXPECT_EQ(t->lr(), lr_at(*s, it)) << "it = " << it;
  }
}

TEST(OneCycle, SecondStairCountDefaultsToFirstAndZeroIsContinuous) {
  SchedulerConfig c = stairs_cycle();
  c.cycle_second_stair_count.reset();  // None -> the first count, 2: floor((15-b)*2/9)/2
  auto s = make_scheduler(c, 1e-3, {0.9, 0.999});
  EXPECT_NEAR(lr_at(*s, 5), 5e-3, 1e-15);   // b = 6: the peak
  EXPECT_NEAR(lr_at(*s, 6), 3e-3, 1e-15);   // b = 7: 16/9 -> 1, scale 0.5
  EXPECT_NEAR(lr_at(*s, 9), 3e-3, 1e-15);   // b = 10: 10/9 -> 1
  EXPECT_NEAR(lr_at(*s, 10), 1e-3, 1e-15);  // b = 11: 8/9 -> 0
  c.cycle_first_stair_count = 0;  // continuous up, stairs of 3 down
  c.cycle_second_stair_count = 3;
  auto t = make_scheduler(c, 1e-3, {0.9, 0.999});
  EXPECT_NEAR(lr_at(*t, 1), 1e-3 + 4e-3 / 3, 1e-15);  // b = 2: 2/6 of the way up
  EXPECT_NEAR(lr_at(*t, 6), 11e-3 / 3, 1e-15);       // b = 7: stair 2/3
  c.cycle_second_stair_count = -1;
  EXPECT_NE(error_of(c).find("scheduler.params.cycle_second_stair_count must be >= 0"), std::string::npos);
}

TEST(LRRangeTest, ContinuousAndStaircase) {
  SchedulerConfig c;
  c.type = "LRRangeTest";
  c.lr_range_test_min_lr = 1e-3;
  c.lr_range_test_step_size = 2000;
  auto s = make_scheduler(c, 1e-3, {0.9, 0.999});
  EXPECT_DOUBLE_EQ(s->lr(), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(*s, 999), 1e-3 * 1.5);
  EXPECT_DOUBLE_EQ(lr_at(*s, 1999), 2e-3);
  c.lr_range_test_staircase = true;
  c.lr_range_test_step_rate = 2.0;
  auto t = make_scheduler(c, 1e-3, {0.9, 0.999});
  EXPECT_DOUBLE_EQ(lr_at(*t, 1998), 1e-3);
  EXPECT_DOUBLE_EQ(lr_at(*t, 1999), 3e-3);
  c.lr_range_test_step_size = 0;
  EXPECT_NE(error_of(c).find("scheduler.params.lr_range_test_step_size"), std::string::npos);
}

TEST(Schedulers, RestoreEqualsStepping) {
  for (const char* type : {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"}) {
    SchedulerConfig c;
    c.type = type;
    c.total_num_steps = 300;
    c.warmup_num_steps = 50;
    c.cycle_min_lr = 1e-4;
    c.cycle_max_lr = 1e-3;
    c.cycle_first_step_size = 40;
    c.lr_range_test_step_size = 30;
    auto a = make_scheduler(c, 1e-3, {0.9, 0.999});
    for (int k = 0; k < 123; ++k) a->step();
    auto b = make_scheduler(c, 1e-3, {0.9, 0.999});
    b->set_last_batch_iteration(a->last_batch_iteration());
    for (int k = 0; k < 20; ++k) {
      EXPECT_EQ(a->lr(), b->lr()) << type;
      EXPECT_EQ(a->betas().has_value(), b->betas().has_value());
      a->step();
      b->step();
    }
  }
}

TEST(Schedulers, ConstantAndUnknownType) {
  auto s = make_scheduler(SchedulerConfig{}, 0.25, {0.9, 0.999});
  for (int k = 0; k < 5; ++k) { EXPECT_EQ(s->lr(), 0.25); s->step(); }
  SchedulerConfig c;
  c.type = "CosineAnnealing";
  EXPECT_NE(error_of(c).find("scheduler.type"), std::string::npos);
}
