// Internal to ds_nn's GEMMs (gemm.cpp: fp32, gemm_bf16.cpp: bf16): the register tile both
// AVX-512 micro-kernels accumulate (MR x NR fp32), its store with the fused epilogue and what
// the packers share (the in-register 16 x 16 transpose, the transposed-A strip groups with
// their row sums). x86-64 only; elsewhere only the bf16 entry's declaration and the portable
// blocking of gemm_blocking.h.
#pragma once

#include <cstdint>

#include "ds/nn/gemm.h"

namespace ds::nn::detail {
// The bf16 kernel with the epilogue (gemm_bf16.cpp; ds::nn::gemm_epilogue is the way in,
// which has checked the epilogue's contract). Requires bf16_gemm_supported().
void gemm_bf16_epilogue(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                        const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                        std::int64_t ldc, const GemmEpilogue& ep);

}  // namespace ds::nn::detail

#include "gemm_blocking.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>

#include "ds/core/bf16_simd.h"

// GCC 12 reports the _mm512_undefined_ps() inside its own intrinsics headers as
// maybe-uninitialized (a false positive; the lanes are all written).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace ds::nn::detail {

// Register tile: MR rows x NR = 4 vectors of 16 columns in 24 zmm accumulators.
constexpr std::int64_t MR = 6;
constexpr std::int64_t NR = 64;

// The first n of 16 lanes (none for n <= 0, all for n >= 16): a row tail's mask.
__attribute__((target("avx512f"))) inline __mmask16 tail_mask16(std::int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// h[0, 16) (lanes in m) = round(h + v) in bf16 or fp16 storage, round to nearest even; bf16
// by integer rounding like ds::float_to_bf16 (NaN kept quiet), fp16 by vcvtps2ph.
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline void half_accumulate(
    std::uint16_t* h, __mmask16 m, __m512 v, bool bf16) {
  const __m256i old = _mm256_maskz_loadu_epi16(m, h);
  __m256i out;
  if (bf16) {
    out = f32x16_to_bf16_rne(_mm512_add_ps(bf16x16_to_f32(old), v));
  } else {
    out = _mm512_cvtps_ph(_mm512_add_ps(_mm512_cvtph_ps(old), v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  _mm256_mask_storeu_epi16(h, m, out);
}

// C tile = alpha acc + beta C, then the epilogue (+ bias[n], + add[m, n]), for the valid
// mv x nv corner. c points at the tile's (0, 0); bias / add are indexed by the tile's
// origin (m0, n0t) in C.
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline void store_tile(
    __m512 (&acc)[MR][4], float alpha, float beta, float* c, std::int64_t ldc, std::int64_t mv,
    std::int64_t nv, const GemmEpilogue& ep = {}, std::int64_t m0 = 0, std::int64_t n0t = 0) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (!ep.half_c && mv == MR && nv == NR) {  // full fp32 tile: unrolled, the epilogue's tests hoisted
    __m512 bias[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j)
      bias[j] = ep.bias ? _mm512_loadu_ps(ep.bias + n0t + 16 * j) : _mm512_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        float* p = c + r * ldc + 16 * j;
        __m512 v = _mm512_mul_ps(acc[r][j], va);
        if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_loadu_ps(p), vb, v);
        if (ep.bias) v = _mm512_add_ps(v, bias[j]);
        if (ep.add) v = _mm512_add_ps(v, _mm512_loadu_ps(ep.add + (m0 + r) * ep.ld_add + n0t + 16 * j));
        _mm512_storeu_ps(p, v);
      }
  } else {
    for (int r = 0; r < mv; ++r)
      for (int j = 0; j < 4; ++j) {
        const std::int64_t n0 = 16 * j;
        if (n0 >= nv) break;
        const __mmask16 m = tail_mask16(nv - n0);
        __m512 v = _mm512_mul_ps(acc[r][j], va);
        if (ep.half_c) {  // 16-bit storage, beta 1 (checked by the caller), no bias / add
          half_accumulate(static_cast<std::uint16_t*>(ep.half_c) + (m0 + r) * ldc + n0t + n0, m, v, ep.half_bf16);
          continue;
        }
        float* p = c + r * ldc + n0;
        if (beta != 0.0f) v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, p), vb, v);
        if (ep.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, ep.bias + n0t + n0));
        if (ep.add) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, ep.add + (m0 + r) * ep.ld_add + n0t + n0));
        _mm512_mask_storeu_ps(p, m, v);
      }
  }
}


// 16 x 16 fp32 (or 32-bit word) transpose in registers (unpack / shuffle / shuffle_f32x4):
// the packers' way to turn k-contiguous rows into k-major panels (AVX-512 gathers are
// microcode-slow on CPUs with the GDS mitigation).
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    r[4 * i + 0] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // r[4i + j] now holds, in 128-bit lane L, column 4L + j of rows 4i..4i+3.
  for (int j = 0; j < 4; ++j) {
    t[j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0x88);        // lanes 0,2 of rows 0-3 / 4-7
    t[4 + j] = _mm512_shuffle_f32x4(r[j], r[4 + j], 0xDD);    // lanes 1,3
    t[8 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0x88);
    t[12 + j] = _mm512_shuffle_f32x4(r[8 + j], r[12 + j], 0xDD);
  }
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88);          // column j
    r[8 + j] = _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD);      // column 8 + j
    r[4 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0x88);  // column 4 + j
    r[12 + j] = _mm512_shuffle_f32x4(t[4 + j], t[12 + j], 0xDD); // column 12 + j
  }
}


// One group of kStripGroup MR-row strips of a transposed A being packed (both kernels pack
// op(A) = A^T this way: the strips share each k row's cache lines): how many strips of the
// group hold rows, each strip's row mask, and its running fp32 row sums (the bias gradient of
// a weight-gradient GEMM), added into row_sum at the end.
struct StripGroup {
  static_assert(MR <= 8, "one 256-bit vector per strip and k");
  std::int64_t ns;
  __mmask8 mask[kStripGroup];
  __m256 sum[kStripGroup];
};
__attribute__((target("avx512f,avx512vl"))) inline void init_strip_group(StripGroup& g, std::int64_t rows) {
  g.ns = std::min<std::int64_t>(kStripGroup, (rows + MR - 1) / MR);
  for (std::int64_t t = 0; t < kStripGroup; ++t) {
    const std::int64_t v = std::clamp<std::int64_t>(rows - t * MR, 0, MR);
    g.mask[t] = __mmask8((1u << v) - 1);
    g.sum[t] = _mm256_setzero_ps();
  }
}
// row_sum[lanes in m] += sum: one strip's row sums.
__attribute__((target("avx512f,avx512vl"))) inline void add_row_sum(float* row_sum, __mmask8 m, __m256 sum) {
  _mm256_mask_storeu_ps(row_sum, m, _mm256_add_ps(_mm256_maskz_loadu_ps(m, row_sum), sum));
}
__attribute__((target("avx512f,avx512vl"))) inline void add_row_sums(const StripGroup& g, float* row_sum) {
  if (!row_sum) return;
  for (std::int64_t t = 0; t < g.ns; ++t) add_row_sum(row_sum + t * MR, g.mask[t], g.sum[t]);
}

}  // namespace ds::nn::detail
#endif  // __x86_64__
