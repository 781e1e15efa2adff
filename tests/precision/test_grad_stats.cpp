// grad_stats (fast) against grad_stats_ref at awkward sizes, for fp32 / fp16 / bf16.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "ds/core/error.h"
#include "scoped_isa.h"
#include "ds/core/half.h"
#include "ds/precision/grad_stats.h"

using ds::DType;
using ds::TensorView;
using namespace ds::precision;

namespace {

struct Buf {
  std::vector<float> f32;
  std::vector<ds::f16> f16v;
  std::vector<ds::bf16> bf16v;
  TensorView view(DType t) {
    switch (t) {
      case DType::F16: return {f16v.data(), f16v.size(), t};
      case DType::BF16: return {bf16v.data(), bf16v.size(), t};
      default: return {f32.data(), f32.size(), t};
    }
  }
  void set(std::size_t i, float v) { f32[i] = v; f16v[i] = ds::float_to_f16(v); bf16v[i] = ds::float_to_bf16(v); }
};

Buf make(std::size_t n, unsigned seed) {
  Buf b;
  b.f32.resize(n); b.f16v.resize(n); b.bf16v.resize(n);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (std::size_t i = 0; i < n; ++i) b.set(i, nd(rng));
  return b;
}

}  // namespace

TEST(GradStats, FastMatchesRefAtAwkwardSizes) {
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(278011), std::size_t(1) << 20 | 3}) {
    Buf b = make(n, unsigned(n));
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
      const GradStats r = grad_stats_ref(b.view(t), 0.125);
      const GradStats f = grad_stats(b.view(t), 0.125);
      EXPECT_FALSE(r.has_inf_or_nan);
      EXPECT_FALSE(f.has_inf_or_nan);
      // Both sum in double; only the summation order differs.
      EXPECT_NEAR(f.sum_of_squares, r.sum_of_squares, 1e-12 * r.sum_of_squares) << "n=" << n << " " << ds::dtype_name(t);
      double direct = 0;
      for (float v : b.f32) direct += double(v) * double(v) / 64.0;
      if (t == DType::F32) {
        EXPECT_NEAR(r.sum_of_squares, direct, 1e-12 * direct);
      }
    }
  }
}

// Every kernel set this CPU runs (plain, avx2, avx512 as it has them) against the reference.
TEST(GradStats, EveryKernelSetMatchesRef) {
  for (ds::CpuIsa isa : ds_test::runnable_isas()) {
    ds_test::ScopedIsa scoped(ds::isa_name(isa));
    for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(278011)}) {
      Buf b = make(n, 17);
      for (DType t : {DType::F32, DType::F16, DType::BF16}) {
        const GradStats r = grad_stats_ref(b.view(t)), f = grad_stats(b.view(t));
        EXPECT_NEAR(f.sum_of_squares, r.sum_of_squares, 1e-12 * r.sum_of_squares) << ds::isa_name(isa) << " n " << n;
        EXPECT_FALSE(f.has_inf_or_nan);
      }
      b.set(n - 1, std::numeric_limits<float>::infinity());
      EXPECT_TRUE(grad_stats(b.view(DType::BF16)).has_inf_or_nan) << ds::isa_name(isa);
      b.set(0, std::numeric_limits<float>::quiet_NaN());
      EXPECT_TRUE(grad_stats(b.view(DType::F32)).has_inf_or_nan) << ds::isa_name(isa);
    }
  }
}

TEST(GradStats, ThreadCountDoesNotChangeTheResult) {
  Buf b = make(600001, 5);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const GradStats one = grad_stats(b.view(DType::F32));
  omp_set_num_threads(3);
  const GradStats three = grad_stats(b.view(DType::F32));
  omp_set_num_threads(saved);
  EXPECT_EQ(one.sum_of_squares, three.sum_of_squares);  // bitwise: fixed blocks, summed in order
}

TEST(GradStats, DetectsInfAndNanAnywhere) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(278011)}) {
    for (std::size_t pos : {std::size_t(0), n / 2, n - 1}) {
      for (float bad : {inf, -inf, nan}) {
        Buf b = make(n, 7);
        b.set(pos, bad);
        for (DType t : {DType::F32, DType::F16, DType::BF16}) {
          EXPECT_TRUE(grad_stats_ref(b.view(t)).has_inf_or_nan) << n << " " << pos;
          EXPECT_TRUE(grad_stats(b.view(t)).has_inf_or_nan) << n << " " << pos << " " << ds::dtype_name(t);
        }
      }
    }
  }
}

TEST(GradStats, LargeFiniteValuesAreNotOverflow) {
  Buf b = make(1000, 3);
  b.set(10, 65504.f);  // fp16 max: its square overflows fp16 and nearly fp32 sums, not double
  for (DType t : {DType::F32, DType::F16, DType::BF16}) {
    EXPECT_FALSE(grad_stats(b.view(t)).has_inf_or_nan);
    EXPECT_FALSE(grad_stats_ref(b.view(t)).has_inf_or_nan);
  }
  std::vector<float> big(100, 3e38f);
  EXPECT_FALSE(grad_stats(TensorView{big.data(), big.size(), DType::F32}).has_inf_or_nan);
}

TEST(GradStats, EmptyAndWrongDtype) {
  EXPECT_EQ(grad_stats(TensorView{nullptr, 0, DType::F32}).sum_of_squares, 0.0);
  std::vector<double> d(4, 1.0);
  EXPECT_THROW(grad_stats(TensorView{d.data(), d.size(), DType::F64}), ds::Error);
  EXPECT_THROW(grad_stats_ref(TensorView{d.data(), d.size(), DType::F64}), ds::Error);
}
