// The own GEMM kernels against a double-precision reference (the bf16 one on bf16-rounded
// inputs), every transpose combination, awkward sizes (edges of every register tile: 6 x 64
// for AVX-512, 6 x 16 for AVX2, 8 x 12 for NEON), alpha/beta, every epilogue. Tolerance: 1e-5
// of sum_k |a||b| per element (fp32 accumulation of exact products). The fp32 tests run on
// every kernel set with an own fp32 kernel (avx2, avx512; neon on aarch64) up to the one in
// use, so the default run covers both x86 ones on an AVX-512 machine, the .isa_avx2 run the
// AVX2 one alone, and the run under qemu-aarch64 the NEON one.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ds/core/cpu_features.h"
#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/nn/gemm.h"
#include "same_bits.h"
#include "scoped_isa.h"

namespace {

float round_bf16(float x) { return ds::bf16_to_float(ds::float_to_bf16(x)); }
bool g_bf16 = true;  // which kernel check() runs

// Random op(A) M x K, op(B) K x N and C M x N with padded leading dimensions (so the kernels
// must honour lda/ldb/ldc).
struct Operands {
  std::int64_t lda, ldb, ldc;
  std::vector<float> A, B, C;
  Operands(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, std::uint64_t seed)
      : lda((ta ? M : K) + 3), ldb((tb ? K : N) + 1), ldc(N + 2),
        A(std::size_t((ta ? K : M) * lda)), B(std::size_t((tb ? N : K) * ldb)), C(std::size_t(M * ldc)) {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> d;
    for (auto* v : {&A, &B, &C})
      for (auto& x : *v) x = d(g);
  }
};

void check(bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha, float beta) {
  Operands o(ta, tb, M, N, K, M * 131 + N * 7 + K);
  const std::int64_t lda = o.lda, ldb = o.ldb, ldc = o.ldc;
  std::vector<float>&A = o.A, &B = o.B, &C = o.C;
  std::vector<float> C0 = C;
  if (g_bf16) ds::nn::gemm_bf16(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  else ds::nn::gemm_f32(ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      double s = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const float ra = ta ? A[k * lda + m] : A[m * lda + k];
        const double a = g_bf16 ? round_bf16(ra) : ra;
        const float rb = tb ? B[n * ldb + k] : B[k * ldb + n];
        const double b = g_bf16 ? round_bf16(rb) : rb;
        s += a * b;
        mag += std::fabs(a * b);
      }
      const double want = alpha * s + (beta != 0.0f ? beta * C0[m * ldc + n] : 0.0);
      ASSERT_NEAR(C[m * ldc + n], want, 1e-5 * (std::fabs(alpha) * mag + std::fabs(beta * C0[m * ldc + n])) + 1e-6)
          << "ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K << " at " << m << "," << n;
    }
  // Padding columns past N are untouched.
  for (std::int64_t m = 0; m < M; ++m) ASSERT_EQ(C[m * ldc + N], C0[m * ldc + N]);
}

// The shapes every kernel's test starts with: one element, partial tiles, alpha and beta.
void check_small_shapes(bool ta, bool tb) {
  check(ta, tb, 1, 1, 1, 1.0f, 0.0f);
  check(ta, tb, 7, 13, 5, 0.5f, 1.0f);
  check(ta, tb, 13, 65, 33, 1.0f, 0.0f);
  check(ta, tb, 70, 130, 64, -2.0f, 0.25f);
}

TEST(NnGemm, Bf16MatchesReference) {
  if (!ds::nn::bf16_gemm_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_small_shapes(ta, tb);
      // Odd K and k-pair tails inside the 16-pair packing blocks; partial strip groups of a
      // transposed A; packed B of 5 KB and of 1.25 MB (both tile orders).
      check(ta, tb, 9, 67, 67, 1.0f, 0.0f);
      check(ta, tb, 301, 70, 520, 1.0f, 1.0f);
      check(ta, tb, 50, 600, 1040, 0.5f, 0.0f);
    }
}

// The kernel sets of this CPU's architecture with an own fp32 GEMM kernel, at or below the
// one in use.
std::vector<ds::CpuIsa> own_f32_isas() {
  const bool arm = ds::cpu_isa_best() == ds::CpuIsa::neon;
  std::vector<ds::CpuIsa> out;
  for (ds::CpuIsa isa : {ds::CpuIsa::avx2, ds::CpuIsa::avx512, ds::CpuIsa::neon})
    if ((isa == ds::CpuIsa::neon) == arm && ds::isa_at_least(isa)) out.push_back(isa);
  return out;
}

// Every vector kernel set (avx2, avx512, neon) runs the layers' GEMMs on an own kernel with
// the fused epilogue; the plain set has none (OpenBLAS). On aarch64 the default set is neon,
// so its run under qemu checks that the NEON kernel is the one the layers use.
TEST(NnGemm, OwnF32KernelOnEveryVectorSet) {
  if (ds::cpu_isa_best() == ds::CpuIsa::neon && ds::cpu_isa() == ds::CpuIsa::neon) {
    EXPECT_EQ(own_f32_isas(), std::vector<ds::CpuIsa>{ds::CpuIsa::neon});
  }
  for (ds::CpuIsa isa : own_f32_isas()) {
    ds_test::ScopedIsa scoped(ds::isa_name(isa));
    EXPECT_TRUE(ds::nn::f32_gemm_supported()) << ds::isa_name(isa);
    EXPECT_TRUE(ds::nn::own_gemm_for_layers(ds::nn::Precision::F32)) << ds::isa_name(isa);
  }
  if (ds::cpu_isa() == ds::CpuIsa::plain) {
    EXPECT_FALSE(ds::nn::f32_gemm_supported());
    EXPECT_THROW(ds::nn::gemm_f32(false, false, 1, 1, 1, 1.0f, nullptr, 1, nullptr, 1, 0.0f, nullptr, 1), ds::Error);
  }
}

TEST(NnGemm, F32BlockedMatchesReference) {
  if (own_f32_isas().empty()) GTEST_SKIP() << "no own fp32 kernel for the kernel set in use";
  g_bf16 = false;
  for (ds::CpuIsa isa : own_f32_isas()) {
    ds_test::ScopedIsa scoped(ds::isa_name(isa));
    SCOPED_TRACE(ds::isa_name(isa));
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_small_shapes(ta, tb);
        check(ta, tb, 6, 64, 0, 1.0f, 0.5f);  // K = 0: C = beta C
        // K > 256: a transposed A is packed (strip groups, a partial last one); op(B) of
        // 145 KB and of 1.25 MB: both tile orders (B in L2 or not).
        check(ta, tb, 301, 70, 520, 1.0f, 1.0f);
        check(ta, tb, 50, 600, 520, 0.5f, 0.0f);
        // Every column remainder of the AVX2 tile (one or two 8-column vectors, partial or
        // full), row remainders 0 and 2-5 (1 above); one full group of eight 6-row strips
        // of A^T and one row more.
        for (std::int64_t n : {8, 9, 15, 16, 17, 24})
          check(ta, tb, 6 + n % 6, n, 9, 1.0f, 0.5f);
        check(ta, tb, 48, 23, 300, 1.0f, 0.0f);
        check(ta, tb, 49, 31, 301, -1.0f, 1.0f);
        // The same for the NEON tile: one to three 4-column vectors, full or 1-3 columns
        // short, a second panel; row remainders 1-7 and 0; one full group of eight 8-row
        // strips of A^T and one row more.
        for (auto [m, n] : {std::array<std::int64_t, 2>{9, 4}, {10, 5}, {11, 6}, {12, 11}, {13, 12}, {14, 13},
                            {15, 14}, {16, 23}})
          check(ta, tb, m, n, 9, 1.0f, 0.5f);
        check(ta, tb, 64, 23, 300, 1.0f, 0.0f);
        check(ta, tb, 65, 13, 301, -1.0f, 1.0f);
      }
  }
  g_bf16 = true;
}

// The own kernels with an epilogue, as the layers call them (gemm_epilogue picks by
// precision): fp32 on each kernel set of own_f32_isas(), bf16 where AVX512-BF16 is.
struct Kernel {
  ds::nn::Precision prec;
  ds::CpuIsa isa;
};
std::vector<Kernel> epilogue_kernels() {
  std::vector<Kernel> k;
  for (ds::CpuIsa isa : own_f32_isas()) k.push_back({ds::nn::Precision::F32, isa});
  if (ds::nn::bf16_gemm_supported()) k.push_back({ds::nn::Precision::BF16, ds::cpu_isa()});
  return k;
}
std::string name(const Kernel& k) {
  return std::string(k.prec == ds::nn::Precision::BF16 ? "bf16 kernel (" : "fp32 kernel (") + ds::isa_name(k.isa) + ")";
}
// f(precision, kernel name) for each epilogue kernel, run on its kernel set.
template <class F>
void for_each_kernel(F&& f) {
  for (const Kernel& k : epilogue_kernels()) {
    ds_test::ScopedIsa scoped(ds::isa_name(k.isa));
    f(k.prec, name(k));
  }
}

// GemmEpilogue::a_row_sum adds each row's sum of op(A) (the bias gradient of a weight
// gradient) from the fp32 values: fp32 kernel: summed while packing a transposed A with
// K > 256, by a plain loop otherwise; bf16 kernel: while packing A, either layout.
TEST(NnGemm, RowSumOfA) {
  if (epilogue_kernels().empty()) GTEST_SKIP() << "no own GEMM kernel for the kernel set in use";
  for_each_kernel([&](ds::nn::Precision prec, const std::string& kname) {
  for (bool ta : {false, true})
    for (auto [M, N, K] : {std::array<std::int64_t, 3>{1, 1, 1}, {13, 20, 33}, {301, 70, 520}, {50, 17, 1000}}) {
      Operands o(ta, false, M, N, K, std::uint64_t(M * 17 + K));
      std::vector<float> rs(std::size_t(M) + 1);
      for (std::int64_t m = 0; m <= M; ++m) rs[std::size_t(m)] = float(m) - 3.0f;  // accumulates; rs[M] untouched
      ds::nn::GemmEpilogue ep;
      ep.a_row_sum = rs.data();
      ds::nn::gemm_epilogue(prec, ta, false, M, N, K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f,
                            o.C.data(), o.ldc, ep);
      for (std::int64_t m = 0; m < M; ++m) {
        double s = double(m) - 3.0, mag = 0;
        for (std::int64_t k = 0; k < K; ++k) {
          const double a = ta ? o.A[std::size_t(k * o.lda + m)] : o.A[std::size_t(m * o.lda + k)];
          s += a;
          mag += std::fabs(a);
        }
        ASSERT_NEAR(rs[std::size_t(m)], s, 1e-5 * mag + 1e-5)
            << kname << " ta " << ta << " M " << M << " K " << K << " row " << m;
      }
      ASSERT_EQ(rs[std::size_t(M)], float(M) - 3.0f);
    }
  });
}

// gemm_tri against the plain triple loop on the defined part: LowerC compares n <= m only;
// LowerA / UpperA get op(A) with zeros in its zero half (what the kernel may skip).
void check_tri(ds::nn::Tri tri, bool ta, bool tb, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
               float beta) {
  using ds::nn::Tri;
  Operands o(ta, tb, M, N, K, M * 131 + N * 7 + K + int(tri));
  const std::int64_t lda = o.lda, ldb = o.ldb, ldc = o.ldc;
  std::vector<float>&A = o.A, &B = o.B, &C = o.C;
  auto aref = [&](std::int64_t m, std::int64_t k) -> float& { return ta ? A[k * lda + m] : A[m * lda + k]; };
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t k = 0; k < K; ++k)
      if ((tri == Tri::LowerA && k > m) || (tri == Tri::UpperA && k < m)) aref(m, k) = 0.0f;
  std::vector<float> C0 = C;
  ds::nn::gemm_tri(tri, ta, tb, M, N, K, alpha, A.data(), lda, B.data(), ldb, beta, C.data(), ldc);
  for (std::int64_t m = 0; m < M; ++m)
    for (std::int64_t n = 0; n < N; ++n) {
      if (tri == Tri::LowerC && n > m) continue;
      double s = 0, mag = 0;
      for (std::int64_t k = 0; k < K; ++k) {
        const double a = aref(m, k);
        const double b = tb ? B[n * ldb + k] : B[k * ldb + n];
        s += a * b;
        mag += std::fabs(a * b);
      }
      const double want = alpha * s + (beta != 0.0f ? beta * C0[m * ldc + n] : 0.0);
      ASSERT_NEAR(C[m * ldc + n], want, 1e-5 * (std::fabs(alpha) * mag + std::fabs(beta * C0[m * ldc + n])) + 1e-6)
          << "tri " << int(tri) << " ta " << ta << " tb " << tb << " M " << M << " N " << N << " K " << K << " at "
          << m << "," << n;
    }
  for (std::int64_t m = 0; m < M; ++m) ASSERT_EQ(C[m * ldc + N], C0[m * ldc + N]);
}

// Each C element is one tile's sum whichever thread computes it (the threads split tiles, not
// k): the same bits on any number of threads, for both kernels, with the weight-gradient
// form's row sums too.
TEST(NnGemm, SameBitsOnAnyThreadCount) {
  if (epilogue_kernels().empty()) GTEST_SKIP() << "no own GEMM kernel for the kernel set in use";
  for_each_kernel([&](ds::nn::Precision prec, const std::string& kname) {
    for (bool ta : {false, true}) {
      const std::int64_t M = 301, N = 600, K = 520;
      Operands o(ta, false, M, N, K, 99 + std::uint64_t(ta));
      auto run = [&](int threads) {
        return ds::test::on_threads(threads, [&] {
          std::vector<float> c = o.C, rs(std::size_t(M), 0.0f);
          ds::nn::GemmEpilogue ep;
          ep.a_row_sum = rs.data();
          ds::nn::gemm_epilogue(prec, ta, false, M, N, K, 0.5f, o.A.data(), o.lda, o.B.data(), o.ldb, 1.0f,
                                c.data(), o.ldc, ep);
          c.insert(c.end(), rs.begin(), rs.end());
          return c;
        });
      };
      const std::vector<float> one = run(1);
      for (int t : {2, 3})
        ASSERT_EQ(ds::test::first_bit_difference(run(t), one), "")
            << kname << " ta " << ta << " (C, then the row sums) on " << t << " threads";
    }
  });
}

// On each own fp32 kernel (avx2, avx512, neon) and on the kernel set in use (plain: the full
// product through the front door).
TEST(NnGemm, TriangularMatchesReference) {
  using ds::nn::Tri;
  std::vector<ds::CpuIsa> sets = own_f32_isas();
  if (sets.empty()) sets.push_back(ds::cpu_isa());
  for (ds::CpuIsa isa : sets) {
    ds_test::ScopedIsa scoped(ds::isa_name(isa));
    SCOPED_TRACE(ds::isa_name(isa));
    for (Tri tri : {Tri::LowerC, Tri::LowerA, Tri::UpperA})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const bool sq = tri != Tri::LowerC;  // op(A) triangles need K == M
          check_tri(tri, ta, tb, 1, 1, 1, 1.0f, 0.0f);
          check_tri(tri, ta, tb, 7, sq ? 5 : 7, 7, 0.5f, 1.0f);
          check_tri(tri, ta, tb, 37, sq ? 17 : 37, sq ? 37 : 13, 1.0f, 0.0f);
          check_tri(tri, ta, tb, 130, sq ? 64 : 130, sq ? 130 : 64, -2.0f, 0.25f);
        }
  }
}

TEST(NnGemm, FrontDoorF32IsSgemm) {
  std::vector<float> A = {1, 2, 3, 4}, B = {5, 6, 7, 8}, C(4, 1.0f);
  ds::nn::gemm(ds::nn::Precision::F32, false, false, 2, 2, 2, 1.0f, A.data(), 2, B.data(), 2, 1.0f, C.data(), 2);
  EXPECT_EQ(C, (std::vector<float>{20, 23, 44, 51}));
}

// GemmEpilogue::half_c: accumulating into bf16 / fp16 storage gives exactly the bits of the
// fp32 result (same kernel, beta 0) added to the old half values and rounded once.
TEST(NnGemm, HalfAccumulateIsFp32ThenOneRounding) {
  if (epilogue_kernels().empty()) GTEST_SKIP() << "no own GEMM kernel for the kernel set in use";
  for_each_kernel([&](ds::nn::Precision prec, const std::string& kname) {
  for (bool bf16 : {true, false})
    for (bool ta : {false, true})
      for (auto [M, N, K] : {std::array<std::int64_t, 3>{1, 1, 1}, {13, 70, 33}, {301, 70, 520}}) {
        Operands o(ta, false, M, N, K, std::uint64_t(M + N + K + bf16));
        std::vector<float> f32(std::size_t(M * o.ldc), 0.0f);
        ds::nn::gemm_epilogue(prec, ta, false, M, N, K, 0.5f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f,
                              f32.data(), o.ldc, {});
        std::vector<std::uint16_t> h(std::size_t(M * o.ldc)), want(h.size());
        for (std::size_t i = 0; i < h.size(); ++i) {
          const float old = o.C[i];  // random; the padding columns must stay as they are
          h[i] = bf16 ? ds::float_to_bf16(old).bits : ds::float_to_f16(old).bits;
          const bool pad = std::int64_t(i % std::size_t(o.ldc)) >= N;
          const float v = bf16 ? ds::bf16_to_float(ds::bf16{h[i]}) : ds::f16_to_float(ds::f16{h[i]});
          want[i] = pad ? h[i] : bf16 ? ds::float_to_bf16(v + f32[i]).bits : ds::float_to_f16(v + f32[i]).bits;
        }
        ds::nn::GemmEpilogue ep;
        ep.half_c = h.data();
        ep.half_bf16 = bf16;
        ds::nn::gemm_epilogue(prec, ta, false, M, N, K, 0.5f, o.A.data(), o.lda, o.B.data(), o.ldb, 1.0f, nullptr,
                              o.ldc, ep);
        for (std::size_t i = 0; i < h.size(); ++i)
          ASSERT_EQ(h[i], want[i]) << kname << (bf16 ? " into bf16" : " into fp16") << " ta " << ta << " M " << M << " N " << N << " K "
                                   << K << " at " << i;
      }
  });
}

// Bias and residual in the epilogue: exactly the plain product (same kernel, beta 0) with the
// bias, then the residual, added in fp32 afterwards; with beta 1 the old C first.
TEST(NnGemm, EpilogueBiasAndAddAreTheSameAdditions) {
  if (epilogue_kernels().empty()) GTEST_SKIP() << "no own GEMM kernel for the kernel set in use";
  for_each_kernel([&](ds::nn::Precision prec, const std::string& kname) {
    for (auto [M, N, K] : {std::array<std::int64_t, 3>{1, 1, 1}, {7, 13, 5}, {12, 128, 40}, {70, 260, 64}}) {
      Operands o(false, true, M, N, K, std::uint64_t(M * 3 + N + K));
      Operands extra(false, false, M, N, 1, std::uint64_t(K + 5));  // its C: the residual, ldc = N + 2
      std::vector<float> bias(static_cast<std::size_t>(N));
      for (std::int64_t n = 0; n < N; ++n) bias[std::size_t(n)] = 0.25f * float(n % 7) - 0.5f;
      for (float beta : {0.0f, 1.0f}) {
        std::vector<float> plain(o.C.size(), 0.0f), got = o.C;
        ds::nn::gemm_epilogue(prec, false, true, M, N, K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, 0.0f,
                              plain.data(), o.ldc, {});
        ds::nn::GemmEpilogue ep;
        ep.bias = bias.data();
        ep.add = extra.C.data();
        ep.ld_add = extra.ldc;
        ds::nn::gemm_epilogue(prec, false, true, M, N, K, 1.0f, o.A.data(), o.lda, o.B.data(), o.ldb, beta,
                              got.data(), o.ldc, ep);
        for (std::int64_t m = 0; m < M; ++m)
          for (std::int64_t n = 0; n < N + 2; ++n) {
            const std::size_t i = std::size_t(m * o.ldc + n);
            float want = o.C[i];  // padding columns untouched
            if (n < N) {
              want = plain[i];
              if (beta != 0.0f) want = std::fma(o.C[i], beta, want);
              want = (want + bias[std::size_t(n)]) + extra.C[std::size_t(m * extra.ldc + n)];
            }
            ASSERT_EQ(got[i], want) << kname << " beta " << beta << " M " << M << " N " << N << " K " << K
                                    << " at " << m << "," << n;
          }
      }
    }
  });
}

}  // namespace
