// resolve_batch_sizes: DeepSpeed's table and assertions (runtime/config.py).
#include <gtest/gtest.h>

#include <string>

#include "ds/config/parse.h"
#include "ds/core/error.h"

namespace {

using namespace ds::config;

#define EXPECT_HAS(hay, needle) EXPECT_NE(std::string(hay).find(needle), std::string::npos) << "in: " << (hay)

DsConfig batch(std::int64_t tb, std::int64_t mb, std::int64_t gas) {
  DsConfig c;
  c.source = "ds.json";
  c.train_batch_size = tb;
  c.train_micro_batch_size_per_gpu = mb;
  c.gradient_accumulation_steps = gas;
  return c;
}

struct Resolved {
  std::int64_t tb, mb, gas;
};
Resolved resolve(std::int64_t tb, std::int64_t mb, std::int64_t gas, int ws) {
  DsConfig c = batch(tb, mb, gas);
  resolve_batch_sizes(c, ws);
  return {c.train_batch_size, c.train_micro_batch_size_per_gpu, c.gradient_accumulation_steps};
}
std::string error_of(std::int64_t tb, std::int64_t mb, std::int64_t gas, int ws) {
  try {
    resolve(tb, mb, gas, ws);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(BatchSizes, DeepSpeedTable) {
  auto r = resolve(32, 4, 4, 2);  // all three: check only
  EXPECT_EQ(r.gas, 4);
  r = resolve(32, 4, 0, 2);  // TB, MB -> GAS = TB // MB // ws
  EXPECT_EQ(r.gas, 4);
  r = resolve(32, 0, 2, 2);  // TB, GAS -> MB = TB // ws // GAS
  EXPECT_EQ(r.mb, 8);
  r = resolve(0, 3, 5, 4);  // MB, GAS -> TB = MB * GAS * ws
  EXPECT_EQ(r.tb, 60);
  r = resolve(16, 0, 0, 4);  // TB only -> GAS 1, MB = TB // ws
  EXPECT_EQ(r.mb, 4);
  EXPECT_EQ(r.gas, 1);
  r = resolve(0, 5, 0, 3);  // MB only -> GAS 1, TB = MB * ws
  EXPECT_EQ(r.tb, 15);
  EXPECT_EQ(r.gas, 1);
  r = resolve(7, 0, 0, 1);  // world size 1
  EXPECT_EQ(r.mb, 7);
}

TEST(BatchSizes, SpecVectorsAtWorldSize2) {
  EXPECT_EQ(resolve(32, 4, 0, 2).gas, 4);  // TB=32, MB=4 -> GAS=4
  // TB=10, MB=3 -> GAS=1, then 10 != 3*1*2
  const std::string e1 = error_of(10, 3, 0, 2);
  EXPECT_HAS(e1, "ds.json: batch sizes do not fit the data-parallel world size 2");
  EXPECT_HAS(e1, "train_batch_size 10 != train_micro_batch_size_per_gpu 3 * gradient_accumulation_steps 1 (derived) * world_size 2");
  EXPECT_HAS(e1, "set train_batch_size to 6");
  EXPECT_HAS(e1, "or train_micro_batch_size_per_gpu to 5 or 1");
  // TB=2, MB=4 -> GAS=0: the GAS assertion fails
  const std::string e2 = error_of(2, 4, 0, 2);
  EXPECT_HAS(e2, "gradient_accumulation_steps = train_batch_size 2 // train_micro_batch_size_per_gpu 4 // world_size 2 = 0, which must be > 0");
  EXPECT_HAS(e2, "set train_batch_size to 8");
  // TB=3 alone -> MB=1, then 3 != 1*1*2
  const std::string e3 = error_of(3, 0, 0, 2);
  EXPECT_HAS(e3, "train_batch_size 3 != train_micro_batch_size_per_gpu 1 (derived) * gradient_accumulation_steps 1 (derived) * world_size 2");
  EXPECT_HAS(e3, "train_batch_size must be divisible by the data-parallel world size 2");
}

TEST(BatchSizes, OtherFailuresAndAdvice) {
  EXPECT_HAS(error_of(0, 0, 4, 2), "either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
  EXPECT_HAS(error_of(0, 0, 0, 2), "either train_batch_size or train_micro_batch_size_per_gpu needs to be provided");
  // All three given and inconsistent: every number and both single-value fixes.
  const std::string e = error_of(32, 4, 2, 2);
  EXPECT_HAS(e, "train_batch_size 32 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2 * world_size 2");
  EXPECT_HAS(e, "set train_batch_size to 16 (= 4 * 2 * 2), or train_micro_batch_size_per_gpu to 8, or gradient_accumulation_steps to 4");
  // TB, GAS: MB derived 0.
  EXPECT_HAS(error_of(4, 0, 4, 2), "train_micro_batch_size_per_gpu = train_batch_size 4 // world_size 2 // gradient_accumulation_steps 4 = 0");
  EXPECT_HAS(error_of(8, 2, 2, 0), "world size must be >= 1");
  // Products that overflow 64 bits are errors, not wrap-around.
  EXPECT_HAS(error_of(1, 4000000000000000000, 4, 2), "batch sizes overflow");
  EXPECT_HAS(error_of(0, 4000000000000000000, 4, 2), "batch sizes overflow");
  // A huge train_batch_size gets its advice at once: the divisors it suggests come from trial
  // division up to 2^20, not up to the square root (2^31 trials for this product of two
  // primes took the config fuzzer past its 10 s timeout). Its only divisors are 1, the two
  // primes and itself; the search finds itself and 1.
  const std::int64_t pq = std::int64_t{2147483647} * 2147483629;
  EXPECT_HAS(error_of(pq, 0, 3, 1), "or gradient_accumulation_steps to 4611685975477714963 or 1 (a divisor of");
  EXPECT_HAS(error_of(3999999999999999999, 0, 4, 1),
             "or gradient_accumulation_steps to 3999999999999999999, 1333333333333333333, 129032258064516129 or "
             "43010752688172043");
}

TEST(BatchSizes, ResolveIsIdempotentAndFromText) {
  DsConfig c = parse_config_text(R"({"train_batch_size": 24, "gradient_accumulation_steps": 3})", "ds.json");
  resolve_batch_sizes(c, 4);
  EXPECT_EQ(c.train_micro_batch_size_per_gpu, 2);
  resolve_batch_sizes(c, 4);
  EXPECT_EQ(c.train_batch_size, 24);
  EXPECT_THROW(resolve_batch_sizes(c, 3), ds::Error);  // resolved values no longer fit 3 ranks
}

}  // namespace
