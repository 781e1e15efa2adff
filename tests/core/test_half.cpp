// fp16 / bf16 conversions: the scalar reference against independent arithmetic, and the
// vectorized bulk paths of every kernel set the CPU runs (F16C / AVX2 / AVX-512 on x86-64,
// NEON on aarch64, the plain loops) against the scalar reference over random bit patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "ds/core/cpu_features.h"
#include "ds/core/half.h"
#include "scoped_isa.h"

using namespace ds;

namespace {
// Independent definition of fp16 round-to-nearest-even: exact double arithmetic over the
// representable neighbours.
double f16_value(std::uint16_t b) {
  int e = (b >> 10) & 31, m = b & 1023;
  double s = (b & 0x8000) ? -1 : 1;
  if (e == 0) return s * std::ldexp(m, -24);
  if (e == 31) return m ? NAN : s * INFINITY;
  return s * std::ldexp(1024 + m, e - 25);
}
}  // namespace

TEST(Half, F16DecodeMatchesDefinitionForAllPatterns) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    float f = f16_to_float(f16{std::uint16_t(b)});
    double want = f16_value(std::uint16_t(b));
    if (std::isnan(want)) { EXPECT_TRUE(std::isnan(f)) << b; continue; }
    EXPECT_EQ(double(f), want) << "pattern " << b;
  }
}

TEST(Half, F16RoundTripIsIdentityForAllNonNan) {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    f16 h{std::uint16_t(b)};
    float f = f16_to_float(h);
    if (std::isnan(f)) { EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(f)))); continue; }
    EXPECT_EQ(float_to_f16(f).bits, h.bits) << b;
  }
}

TEST(Half, F16RoundsToNearestEvenAtMidpoints) {
  // Midpoint between two adjacent positive finite fp16 values must round to the even one.
  for (std::uint32_t b = 0; b < 0x7bff; ++b) {
    double lo = f16_value(std::uint16_t(b)), hi = f16_value(std::uint16_t(b + 1));
    float mid = float((lo + hi) / 2);  // exact in float: fp16 has 11 significant bits
    std::uint16_t even = (b % 2 == 0) ? std::uint16_t(b) : std::uint16_t(b + 1);
    ASSERT_EQ(float_to_f16(mid).bits, even) << "between " << b << " and " << b + 1;
    ASSERT_EQ(float_to_f16(-mid).bits, std::uint16_t(even | 0x8000));
  }
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);  // rounds up to inf
  EXPECT_EQ(float_to_f16(65519.0f).bits, 0x7bff);  // stays at max finite
  EXPECT_EQ(float_to_f16(1e-9f).bits, 0);          // underflows to zero
}

TEST(Half, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f).bits, 0x3f80);
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)).bits, 0x3f80);
  // 1 + 3*2^-8 is the midpoint between 1+2^-7 (odd) and 1+2^-6 (even) -> up.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)).bits, 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
}

namespace {
// The bulk converters of the kernel set in use against the scalar code, bitwise (a NaN's fp16
// payload may differ: only NaN-ness is compared there).
void check_bulk_paths() {
  // Awkward size so vector tails run; random floats across the whole range plus specials.
  const std::size_t n = 278011;
  std::mt19937 rng(7);
  std::vector<float> x(n);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (std::size_t i = 0; i < n; ++i) x[i] = bits_to_float(bits(rng));
  for (std::size_t i = 0; i < 1000; ++i) x[i] = std::uniform_real_distribution<float>(-70000, 70000)(rng);
  x[1000] = INFINITY; x[1001] = -INFINITY; x[1002] = 0.0f; x[1003] = -0.0f;

  std::vector<f16> h(n);
  std::vector<bf16> b(n);
  convert_f32_to_f16(x.data(), h.data(), n);
  convert_f32_to_bf16(x.data(), b.data(), n);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(b[i].bits, float_to_bf16(x[i]).bits) << "bf16 at " << i;  // NaNs too: the same quiet NaN
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(f16_to_float(h[i]))) << i;
      continue;
    }
    ASSERT_EQ(h[i].bits, float_to_f16(x[i]).bits) << "f16 at " << i << " x=" << x[i];
    ASSERT_EQ(b[i].bits, float_to_bf16(x[i]).bits) << "bf16 at " << i;
  }
  std::vector<float> back(n);
  convert_f16_to_f32(h.data(), back.data(), n);
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isnan(back[i])) { ASSERT_EQ(back[i], f16_to_float(h[i])) << i; }
  convert_bf16_to_f32(b.data(), back.data(), n);
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isnan(back[i])) { ASSERT_EQ(back[i], bf16_to_float(b[i])) << i; }
}
}  // namespace

TEST(Half, BulkPathsMatchScalarReference) {
  for (CpuIsa isa : ds_test::runnable_isas()) {
    ds_test::ScopedIsa scoped(isa_name(isa));
    SCOPED_TRACE(isa_name(isa));
    check_bulk_paths();
  }
}
