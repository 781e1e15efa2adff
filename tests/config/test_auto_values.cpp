// The Hugging Face Trainer's "auto" placeholders: filled from what the job knows and reported
// one line per key, or refused naming the key, where it is and what to write; never a silent
// default for a learning rate or a precision (fill_auto_values, ds/config/parse.h).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "parse_test_util.h"

using config_test::parse;
using ds::config::fill_auto_values;
using ds::config::KnownValues;

namespace {

// The error of resolving text's batch sizes at world size ws and filling its autos, or "".
std::string fill_error(const std::string& text, const KnownValues& known, int ws = 1) {
  try {
    auto cfg = parse(text);
    ds::config::resolve_batch_sizes(cfg, ws);
    fill_auto_values(cfg, known);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

std::string joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

}  // namespace

TEST(AutoValues, AllBatchKeysAutoIsAnErrorNamingThemAndWhereTheyAre) {
  const std::string e = fill_error(
      R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"})",
      {});
  EXPECT_HAS(e, "train_batch_size (ds.json:1:2)");
  EXPECT_HAS(e, "train_micro_batch_size_per_gpu (ds.json:1:30)");
  EXPECT_HAS(e, "Hugging Face Trainer");
  EXPECT_HAS(e, "\"train_micro_batch_size_per_gpu\": 8");
}

TEST(AutoValues, BatchKeysAreFilledByTheArithmeticAndReported) {
  auto cfg = parse(R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": "auto",
                       "gradient_accumulation_steps": "auto"})");
  ds::config::resolve_batch_sizes(cfg, 2);
  const std::string out = joined(fill_auto_values(cfg, {}));
  EXPECT_HAS(out, "ds.json:1:26: train_micro_batch_size_per_gpu: \"auto\" -> 8 (from the batch arithmetic)");
  EXPECT_HAS(out, "gradient_accumulation_steps: \"auto\" -> 1");
}

TEST(AutoValues, LearningRateNeedsTheCommandLine) {
  const std::string text = R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})";
  const std::string e = fill_error(text, {});
  EXPECT_HAS(e, "ds.json:1:67: optimizer.params.lr: \"auto\" is a placeholder the Hugging Face Trainer fills");
  EXPECT_HAS(e, "write a number, or pass --lr");
  auto cfg = parse(text);
  ds::config::resolve_batch_sizes(cfg, 1);
  KnownValues known;
  known.lr = 5e-5;
  EXPECT_HAS(joined(fill_auto_values(cfg, known)), "optimizer.params.lr: \"auto\" -> 5e-05 (from --lr)");
  EXPECT_DOUBLE_EQ(cfg.optimizer->lr, 5e-5);
}

TEST(AutoValues, APrecisionIsNeverChosenSilently) {
  KnownValues all;
  all.lr = 1e-4;
  all.total_steps = 10;
  for (const char* section : {"fp16", "bf16", "bfloat16"}) {
    const std::string text = std::string(R"({"train_batch_size": 8, ")") + section + R"(": {"enabled": "auto"}})";
    const std::string e = fill_error(text, all);
    EXPECT_HAS(e, std::string(section) + ".enabled: \"auto\"");
    EXPECT_HAS(e, "write true or false");
  }
}

TEST(AutoValues, TotalStepsComeFromTheRunLength) {
  const std::string text = R"({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": "auto", "warmup_max_lr": "auto",
                                                        "warmup_num_steps": "auto"}}})";
  EXPECT_HAS(fill_error(text, {}), "scheduler.params.total_num_steps: \"auto\"");
  auto cfg = parse(text);  // "auto" in a required key is not "missing" at parse time
  ds::config::resolve_batch_sizes(cfg, 1);
  KnownValues known;
  known.total_steps = 300;
  const std::string out = joined(fill_auto_values(cfg, known));
  EXPECT_HAS(out, "scheduler.params.total_num_steps: \"auto\" -> 300 (from --steps)");
  // The warmup peaks at the learning rate, as the HF Trainer fills it (not WarmupDecayLR's 1e-3).
  EXPECT_HAS(out, "scheduler.params.warmup_max_lr: \"auto\" -> 0.0001");
  // Any other key keeps the default, and says so.
  EXPECT_HAS(out, "scheduler.params.warmup_num_steps: \"auto\" -> 1000 (dstrain's default");
  EXPECT_EQ(cfg.scheduler->total_num_steps, 300);
  EXPECT_TRUE(fill_auto_values(cfg, known).empty()) << "a second call reports again";
}

TEST(AutoValues, AutoAsOneOfDstrainsOwnChoicesIsNotAPlaceholder) {
  auto cfg = parse(R"({"train_batch_size": 8, "kernels": {"attention": "auto"},
                       "communication": {"device_backend": "auto"}})");
  EXPECT_TRUE(cfg.auto_values.empty());
}
