// bf16 GEMM with AVX512-BF16 (see ds/nn/gemm.h).
//
// Goto-style, one level: both operands are packed whole (rounded to bf16 on the way, round
// to nearest even, ds::f32x16_to_bf16_rne) into panels whose k dimension is stored in pairs,
// the layout `vdpbf16ps` consumes:
//   A panel (MR rows):  [K/2][MR] 32-bit words, word = (a[r][2k], a[r][2k+1])
//   B panel (NR cols):  [K/2][NR] 32-bit words, word = (b[2k][c], b[2k+1][c])
// The micro-kernel keeps the MR x NR = 6 x 64 fp32 tile of gemm_tile.h in 24 zmm
// accumulators; per k pair it loads 4 B vectors and broadcasts 6 A words: 24 vdpbf16ps
// (1536 FLOPs) per 10 loads. Its store runs the same epilogue as the fp32 kernel (bias,
// residual add, 16-bit gradient accumulation); the row sums of op(A) are taken from the fp32
// values while A is packed.
//
// Packing is vectorised: operand rows contiguous in k give 32 floats -> 16 pair words per
// load pair (one vpermt2w picks the rounded high halves) and go through the 16 x 16 word
// transpose; rows contiguous in the panel index pair two k rows lane by lane.
#include <omp.h>

#include <algorithm>

#include "ds/core/cpu_features.h"
#include "ds/core/error.h"
#include "gemm_tile.h"

namespace ds::nn {
#if defined(__x86_64__)
namespace {

using namespace detail;

#define DS_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

// Rounding by the project's converter (ds/core/bf16_simd.h: round to nearest even) in its
// 32-bit-lane form without the NaN fix-up: the bf16 is each lane's high half (a NaN may come
// out as an infinity, still non-finite). Lane-wise pairs: word i = bf16(lo[i]) | bf16(hi[i]) << 16.
DS_BF16_TARGET inline __m512i pair_lanes(__m512 lo, __m512 hi) {
  return _mm512_or_si512(_mm512_srli_epi32(f32x16_to_bf16_rne_hi_finite(lo), 16),
                         _mm512_and_si512(f32x16_to_bf16_rne_hi_finite(hi), _mm512_set1_epi32(int(0xFFFF0000u))));
}
// The same for the 8 lanes of a strip: lo and hi rounded together in one 16-lane vector.
DS_BF16_TARGET inline __m256i pair_lanes(__m256 lo, __m256 hi) {
  const __m512i r = f32x16_to_bf16_rne_hi_finite(
      _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(lo)), _mm256_castps_pd(hi), 1)));
  return _mm256_or_si256(_mm256_srli_epi32(_mm512_castsi512_si256(r), 16),
                         _mm256_and_si256(_mm512_extracti64x4_epi64(r, 1), _mm256_set1_epi32(int(0xFFFF0000u))));
}
// 32 consecutive floats (x0 = [0, 16), x1 = [16, 32)) -> 16 words, word p = (x[2p], x[2p+1]):
// the high halves of the 32 rounded lanes in order (one vpermt2w).
alignas(64) constexpr std::uint16_t kOddHalves[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                     23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                     45, 47, 49, 51, 53, 55, 57, 59, 61, 63};
DS_BF16_TARGET inline __m512i pair_consecutive(__m512 x0, __m512 x1) {
  return _mm512_permutex2var_epi16(f32x16_to_bf16_rne_hi_finite(x0), _mm512_load_si512(kOddHalves),
                                   f32x16_to_bf16_rne_hi_finite(x1));
}

// Row `row` of X (k contiguous), k pairs [kp0, kp0 + 16) as 16 words; zeros past K.
DS_BF16_TARGET inline __m512i row_words(const float* row, std::int64_t kp0, std::int64_t K, __m512* sum) {
  const std::int64_t k0 = 2 * kp0;
  const __m512 x0 = _mm512_maskz_loadu_ps(tail_mask16(K - k0), row + k0);
  const __m512 x1 = _mm512_maskz_loadu_ps(tail_mask16(K - k0 - 16), row + k0 + 16);
  if (sum) *sum = _mm512_add_ps(*sum, _mm512_add_ps(x0, x1));
  return pair_consecutive(x0, x1);
}

// Panel of W = NR rows of X whose k is contiguous (B transposed): 16 x 16 word blocks
// transposed in registers.
DS_BF16_TARGET void pack_k_rows_64(std::uint32_t* __restrict out, const float* base, std::int64_t ld,
                                   std::int64_t valid, std::int64_t K) {
  const std::int64_t K2 = (K + 1) / 2;
  for (std::int64_t kp0 = 0; kp0 < K2; kp0 += 16) {
    const std::int64_t kw = std::min<std::int64_t>(16, K2 - kp0);
    for (int j = 0; j < 4; ++j) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const std::int64_t row = 16 * j + i;
        r[i] = row < valid ? _mm512_castsi512_ps(row_words(base + row * ld, kp0, K, nullptr)) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (std::int64_t t = 0; t < kw; ++t) _mm512_storeu_ps(reinterpret_cast<float*>(out + (kp0 + t) * NR + 16 * j), r[t]);
    }
  }
}

// Panel of MR rows of X whose k is contiguous (A not transposed), with optional row sums.
DS_BF16_TARGET void pack_k_rows_mr(std::uint32_t* __restrict out, const float* base, std::int64_t ld,
                                   std::int64_t valid, std::int64_t K, float* row_sum) {
  const std::int64_t K2 = (K + 1) / 2;
  __m512 sum[MR];
  for (auto& s : sum) s = _mm512_setzero_ps();
  alignas(64) std::uint32_t w[MR][16];
  for (std::int64_t kp0 = 0; kp0 < K2; kp0 += 16) {
    const std::int64_t kw = std::min<std::int64_t>(16, K2 - kp0);
    for (int r = 0; r < MR; ++r)
      _mm512_store_si512(w[r], r < valid ? row_words(base + r * ld, kp0, K, row_sum ? &sum[r] : nullptr)
                                         : _mm512_setzero_si512());
    for (std::int64_t t = 0; t < kw; ++t)
      for (int r = 0; r < MR; ++r) out[(kp0 + t) * MR + r] = w[r][t];
  }
  if (row_sum)
    for (std::int64_t r = 0; r < std::min<std::int64_t>(valid, MR); ++r) row_sum[r] += _mm512_reduce_add_ps(sum[r]);
}

// Panel of W = NR columns of X stored transposed (X(i, k) at p[k * ld + i]: B not
// transposed): two k rows paired lane by lane.
DS_BF16_TARGET void pack_i_rows_64(std::uint32_t* __restrict out, const float* base, std::int64_t ld,
                                   std::int64_t valid, std::int64_t K) {
  const std::int64_t K2 = (K + 1) / 2;
  for (std::int64_t kp = 0; kp < K2; ++kp) {
    const float* r0 = base + 2 * kp * ld;
    const bool has1 = 2 * kp + 1 < K;
    for (int j = 0; j < 4; ++j) {
      const __mmask16 m = tail_mask16(valid - 16 * j);
      const __m512 lo = _mm512_maskz_loadu_ps(m, r0 + 16 * j);
      const __m512 hi = has1 ? _mm512_maskz_loadu_ps(m, r0 + ld + 16 * j) : _mm512_setzero_ps();
      _mm512_storeu_si512(out + kp * NR + 16 * j, pair_lanes(lo, hi));
    }
  }
}

// MR-row panels of op(A) = A^T (A stored K x M), kStripGroup strips at a time so that the
// strips share each k row's cache lines; row sums of the fp32 values on the way.
DS_BF16_TARGET void pack_at_group(std::uint32_t* __restrict out, const float* src, std::int64_t ld,
                                  std::int64_t rows, std::int64_t K, float* row_sum) {
  const std::int64_t K2 = (K + 1) / 2;
  StripGroup g;
  init_strip_group(g, rows);
  const __mmask8 full = __mmask8((1u << MR) - 1);
  for (std::int64_t kp = 0; kp < K2; ++kp) {
    const float* r0 = src + 2 * kp * ld;
    const bool has1 = 2 * kp + 1 < K;
    for (std::int64_t t = 0; t < g.ns; ++t) {
      const __m256 lo = _mm256_maskz_loadu_ps(g.mask[t], r0 + t * MR);
      const __m256 hi = has1 ? _mm256_maskz_loadu_ps(g.mask[t], r0 + ld + t * MR) : _mm256_setzero_ps();
      _mm256_mask_storeu_epi32(out + t * MR * K2 + kp * MR, full, pair_lanes(lo, hi));
      g.sum[t] = _mm256_add_ps(g.sum[t], _mm256_add_ps(lo, hi));
    }
  }
  add_row_sums(g, row_sum);
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma"))) void micro_kernel(
    const std::uint32_t* __restrict a, const std::uint32_t* __restrict b, std::int64_t K2, float alpha,
    float beta, float* c, std::int64_t ldc, std::int64_t mv, std::int64_t nv, const GemmEpilogue& ep,
    std::int64_t m0, std::int64_t n0) {
  __m512 acc[MR][4];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  for (std::int64_t kp = 0; kp < K2; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + kp * NR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + kp * NR + 16);
    const __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + kp * NR + 32);
    const __m512bh b3 = (__m512bh)_mm512_loadu_si512(b + kp * NR + 48);
    const std::uint32_t* ak = a + kp * MR;
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ak[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], av, b2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], av, b3);
    }
  }
  store_tile(acc, alpha, beta, c, ldc, mv, nv, ep, m0, n0);
}

}  // namespace
#endif  // __x86_64__

bool bf16_gemm_supported() {
  return cpu_isa() == CpuIsa::avx512 && cpu_features().avx512_bf16;
}

void detail::gemm_bf16_epilogue(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                                float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                                float beta, float* C, std::int64_t ldc, const GemmEpilogue& ep) {
  DS_CHECK(bf16_gemm_supported(), "gemm_bf16: this CPU has no AVX512-BF16");
#if defined(__x86_64__)
  if (M <= 0 || N <= 0) return;
  const std::int64_t K2 = (K + 1) / 2, K2p = std::max<std::int64_t>(K2, 1);
  const std::int64_t mp = (M + MR - 1) / MR, np = (N + NR - 1) / NR;
  std::uint32_t* pa = ensure(0, std::size_t(mp * MR * K2p));
  std::uint32_t* pb = ensure(1, std::size_t(np * NR * K2p));
  const bool par = !omp_in_parallel() && M * N * std::max<std::int64_t>(K, 1) > (1 << 21);
  auto run = [&](bool team) {
    if (trans_a) {
      for_range(team, true, 0, mp, kStripGroup, [&](std::int64_t g) {
        pack_at_group(pa + g * MR * K2, A + g * MR, lda, M - g * MR, K, ep.a_row_sum ? ep.a_row_sum + g * MR : nullptr);
      });
    } else {
      for_range(team, true, 0, mp, 1, [&](std::int64_t i) {
        pack_k_rows_mr(pa + i * MR * K2, A + i * MR * lda, lda, M - i * MR, K,
                       ep.a_row_sum ? ep.a_row_sum + i * MR : nullptr);
      });
    }
    // op(B)(k, n): B stored N x K when trans_b (k contiguous per column panel row), else K x N.
    for_range(team, false, 0, np, 1, [&](std::int64_t j) {
      if (trans_b) pack_k_rows_64(pb + j * NR * K2, B + j * NR * ldb, ldb, N - j * NR, K);
      else pack_i_rows_64(pb + j * NR * K2, B + j * NR, ldb, N - j * NR, K);
    });
    // Tile order as in the fp32 kernel (for_each_tile, gemm_tile.h).
    for_each_tile(team, mp, np, std::uint64_t(K2p) * NR * 4, [&](std::int64_t i, std::int64_t j) {
      const std::int64_t m0 = i * MR, n0 = j * NR;
      micro_kernel(pa + i * MR * K2, pb + j * NR * K2, K2, alpha, beta, ep.half_c ? nullptr : C + m0 * ldc + n0, ldc,
                   std::min(MR, M - m0), std::min(NR, N - n0), ep, m0, n0);
    });
  };
  run_gemm(par, run);
#else
  (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B, (void)ldb;
  (void)beta, (void)C, (void)ldc, (void)ep;
#endif
}

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
               float beta, float* C, std::int64_t ldc) {
  detail::gemm_bf16_epilogue(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, {});
}

}  // namespace ds::nn
