// op_profile.h, the per-op profile Gpt and GptCuda share: rows by name in first-seen order
// (after the names given to reset, at zero), totals per call; and Gpt's profile of one step.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "ds/nn/gpt.h"
#include "ds/nn/op_profile.h"
#include "model_harness.h"

TEST(OpProfile, RowsAndTotals) {
  ds::nn::OpProfile p;
  EXPECT_TRUE(p.rows().empty());
  const char* const names[] = {"a", "b"};
  p.reset(names);
  ASSERT_EQ(p.rows().size(), 2u);
  EXPECT_EQ(p.rows()[1].op, "b");
  EXPECT_EQ(p.rows()[1].calls, 0);
  p.add(std::size_t(1), 0.5, 0.25, 8);
  p.add(std::string_view("b"), 0.5, 0.25);
  p.add(std::string_view("c"), 0, 2e-3);
  ASSERT_EQ(p.rows().size(), 3u);
  EXPECT_EQ(p.rows()[1].calls, 2);
  EXPECT_DOUBLE_EQ(p.rows()[1].cpu_s, 1.0);
  EXPECT_DOUBLE_EQ(p.rows()[1].wall_s, 0.5);
  EXPECT_DOUBLE_EQ(p.rows()[1].flops, 8);
  EXPECT_EQ(p.rows()[2].op, "c");
  EXPECT_EQ(p.rows()[2].calls, 1);
  p.reset();
  EXPECT_TRUE(p.rows().empty());
}

TEST(OpProfile, GptStepFillsItsOps) {
  ds::nn::Gpt m({1, 2, 8, 8, 16});
  dstest::Harness h(m, 1);
  EXPECT_TRUE(m.profile().empty());  // off until asked
  m.set_profiling(true);
  std::vector<std::int32_t> in(2 * 8), tg(2 * 8);
  std::mt19937_64 g(5);
  for (auto& x : in) x = std::int32_t(g() % 16);
  for (auto& x : tg) x = std::int32_t(g() % 16);
  ds::Batch b;
  b.inputs = in;
  b.targets = tg;
  b.batch = 2;
  b.seq = 8;
  m.forward(b);
  m.backward(1.0f, [](std::size_t) {});
  std::set<std::string> names;
  double flops = 0;
  for (const auto& o : m.profile()) {
    EXPECT_TRUE(names.insert(o.op).second) << o.op << " twice";
    flops += o.flops;
  }
  ASSERT_TRUE(names.count("attention fwd"));
  for (const auto& o : m.profile()) {
    if (o.op == "attention fwd" || o.op == "qkv linear bwd") {
      EXPECT_GE(o.calls, 1) << o.op;
      EXPECT_GE(o.wall_s, 0) << o.op;
    }
  }
  EXPECT_GT(flops, 0);
}
