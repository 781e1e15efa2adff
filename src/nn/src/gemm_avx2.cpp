// fp32 GEMM with AVX2 + FMA: the kernel set for CPUs without AVX-512 (and DS_CPU_ISA=avx2),
// run by the same blocked driver as the AVX-512 kernel (gemm_driver.h) with the same fused
// epilogue (bias, residual, 16-bit gradient accumulation, row sums of op(A)).
//
// Register tile 6 x 16: 12 ymm accumulators, two B vectors and one broadcast of A per k (15
// of the 16 ymm registers), so each k step is 12 FMAs against 2 loads and 6 broadcasts.
// op(B) is always packed into 16-column k-major panels (8 x 8 register transposes when its k
// is contiguous); a long transposed A is packed into [k][6] strips, eight
// strips at a time, summing its rows on the way. The functions carry their target attribute,
// so the rest of ds_nn stays baseline x86-64.
#include <cstring>

#include "gemm_driver.h"

#if defined(__x86_64__)
namespace ds::nn::detail {
namespace {

#define DS_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))

constexpr std::int64_t kMR = 6;
constexpr std::int64_t kNR = 16;

// Lanes [0, n) set (n clamped to [0, 8]): a maskload / maskstore mask.
DS_AVX2_TARGET inline __m256i lanes_below(std::int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<std::int64_t>(n, 0, 8))), idx);
}

// h[0, n) = round(h + v) in bf16 or fp16 storage, round to nearest even (as the AVX-512
// epilogue's half_accumulate): bf16 by integer rounding, fp16 by vcvtps2ph. A partial vector
// goes through a small buffer (AVX2 has no 16-bit masked loads).
DS_AVX2_TARGET inline void half_accumulate8(std::uint16_t* h, std::int64_t n, __m256 v, bool bf16) {
  alignas(16) std::uint16_t part[8] = {};
  std::uint16_t* io = n >= 8 ? h : part;
  if (n < 8) std::memcpy(part, h, std::size_t(n) * 2);
  const __m128i old = _mm_loadu_si128(reinterpret_cast<const __m128i*>(io));
  const __m128i out = bf16 ? f32x8_to_bf16_rne(_mm256_add_ps(bf16x8_to_f32(old), v))
                           : _mm256_cvtps_ph(_mm256_add_ps(_mm256_cvtph_ps(old), v), _MM_FROUND_TO_NEAREST_INT);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(io), out);
  if (n < 8) std::memcpy(h, part, std::size_t(n) * 2);
}

// C tile = alpha acc + beta C, then + bias[n], + add[m, n], for the valid mv x nv corner (the
// same operations in the same order as the AVX-512 store_tile, so the same bits per element).
DS_AVX2_TARGET inline void store_tile8(__m256 (&acc)[kMR][2], float alpha, float beta, float* c, std::int64_t ldc,
                                       std::int64_t mv, std::int64_t nv, const GemmEpilogue& ep, std::int64_t m0,
                                       std::int64_t n0t) {
  const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
  if (!ep.half_c && mv == kMR && nv == kNR) {  // full fp32 tile: unrolled, the epilogue's tests hoisted
    __m256 bias[2];
    for (int j = 0; j < 2; ++j) bias[j] = ep.bias ? _mm256_loadu_ps(ep.bias + n0t + 8 * j) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 2
      for (int j = 0; j < 2; ++j) {
        float* p = c + r * ldc + 8 * j;
        __m256 v = _mm256_mul_ps(acc[r][j], va);
        if (beta != 0.0f) v = _mm256_fmadd_ps(_mm256_loadu_ps(p), vb, v);
        if (ep.bias) v = _mm256_add_ps(v, bias[j]);
        if (ep.add) v = _mm256_add_ps(v, _mm256_loadu_ps(ep.add + (m0 + r) * ep.ld_add + n0t + 8 * j));
        _mm256_storeu_ps(p, v);
      }
    return;
  }
  for (int r = 0; r < mv; ++r)
    for (int j = 0; j < 2; ++j) {
      const std::int64_t n0 = 8 * j;
      if (n0 >= nv) break;
      __m256 v = _mm256_mul_ps(acc[r][j], va);
      if (ep.half_c) {  // 16-bit storage, beta 1 (checked by the caller), no bias / add
        std::uint16_t* h = static_cast<std::uint16_t*>(ep.half_c) + (m0 + r) * ldc + n0t + n0;
        half_accumulate8(h, std::min<std::int64_t>(8, nv - n0), v, ep.half_bf16);
        continue;
      }
      const __m256i m = lanes_below(nv - n0);
      float* p = c + r * ldc + n0;
      if (beta != 0.0f) v = _mm256_fmadd_ps(_mm256_maskload_ps(p, m), vb, v);
      if (ep.bias) v = _mm256_add_ps(v, _mm256_maskload_ps(ep.bias + n0t + n0, m));
      if (ep.add) v = _mm256_add_ps(v, _mm256_maskload_ps(ep.add + (m0 + r) * ep.ld_add + n0t + n0, m));
      _mm256_maskstore_ps(p, m, v);
    }
}

// NV = number of 8-wide column vectors the tile computes (a causal C skips the second when
// it lies wholly above the diagonal). A element (r, k) at a[r * rs + k * ks], rows past mv
// repeating the last valid row (not stored); B's 16 columns of row k at b + k * bs.
template <int NV>
DS_AVX2_TARGET void micro_kernel_avx2(const float* __restrict a, std::int64_t rs, std::int64_t ks,
                                      const float* __restrict b, std::int64_t bs, std::int64_t K, float alpha,
                                      float beta, float* c, std::int64_t ldc, std::int64_t mv, std::int64_t nv,
                                      const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0) {
  __m256 acc[kMR][2];
  const float* ar[kMR];
#pragma GCC unroll 6
  for (int r = 0; r < kMR; ++r) {
    ar[r] = a + std::min<std::int64_t>(r, mv - 1) * rs;
    acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (std::int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(b + k * bs);
    const __m256 b1 = NV > 1 ? _mm256_loadu_ps(b + k * bs + 8) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < kMR; ++r) {
      // set1 of a loaded float, not _mm256_broadcast_ss(pointer): with the pointer form GCC 12
      // stored all 12 accumulators to the stack every k (47-55 against 85-103 GFLOP/s at the
      // model shapes of bench_gemm_shapes).
      const __m256 av = _mm256_set1_ps(ar[r][k * ks]);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      if (NV > 1) acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  store_tile8(acc, alpha, beta, c, ldc, mv, std::min<std::int64_t>(nv, 8 * NV), ep, m0, n0);
}

// 8 x 8 transpose in registers.
DS_AVX2_TARGET inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    s[4 * i + 0] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 1] = _mm256_shuffle_ps(t[4 * i + 0], t[4 * i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    s[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    s[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  // s[j] (rows 0-3) and s[4 + j] (rows 4-7) hold columns j and 4 + j in their two 128-bit halves.
  for (int j = 0; j < 4; ++j) {
    r[j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x20);
    r[4 + j] = _mm256_permute2f128_ps(s[j], s[4 + j], 0x31);
  }
}

// 16 rows of X (k contiguous: B transposed) into a k-major panel of 16: 8 x 8 blocks
// transposed in registers, rows past `valid` as zeros.
DS_AVX2_TARGET void pack_rows_k_major_16(float* __restrict out, const float* base, std::int64_t ld,
                                         std::int64_t valid, std::int64_t K) {
  for (std::int64_t k0 = 0; k0 < K; k0 += 8) {
    const std::int64_t kw = std::min<std::int64_t>(8, K - k0);
    const __m256i km = lanes_below(kw);
    for (int j = 0; j < 2; ++j) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        const std::int64_t row = 8 * j + i;
        const float* p = base + row * ld + k0;
        r[i] = row >= valid ? _mm256_setzero_ps() : kw == 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, km);
      }
      transpose8(r);
      for (std::int64_t t = 0; t < kw; ++t) _mm256_storeu_ps(out + (k0 + t) * kNR + 8 * j, r[t]);
    }
  }
}

// out[k][0, 16) = src[k * ld + c] for c < valid, zeros past it: the k rows of a B stored
// K x N as one panel (two vector copies per row when the panel is whole).
DS_AVX2_TARGET void copy_rows_16(float* __restrict out, const float* src, std::int64_t ld, std::int64_t valid,
                                 std::int64_t K) {
  const __m256i m0 = lanes_below(valid), m1 = lanes_below(valid - 8);
  for (std::int64_t k = 0; k < K; ++k) {
    const float* row = src + k * ld;
    const bool whole = valid == kNR;
    _mm256_storeu_ps(out + k * kNR, whole ? _mm256_loadu_ps(row) : _mm256_maskload_ps(row, m0));
    _mm256_storeu_ps(out + k * kNR + 8, whole ? _mm256_loadu_ps(row + 8) : _mm256_maskload_ps(row + 8, m1));
  }
}

// op(A) = A^T into [k][6] strips, kStripGroup strips at a time (they share each k row's cache
// lines), each strip's row sums in a register. A strip's 6 values per k are one 8-float load
// (masked where it would reach past the group's rows) and one 8-float store whose last two
// floats the next k overwrites; the last k stores 6.
DS_AVX2_TARGET void pack_at_group_avx2(float* __restrict out, const float* src, std::int64_t ld, std::int64_t rows,
                                       std::int64_t K, float* row_sum) {
  const std::int64_t ns = std::min<std::int64_t>(kStripGroup, (rows + kMR - 1) / kMR);
  __m256 sum[kStripGroup];
  __m256i mask[kStripGroup];
  for (std::int64_t t = 0; t < kStripGroup; ++t) {
    sum[t] = _mm256_setzero_ps();
    mask[t] = lanes_below(std::min<std::int64_t>(rows - t * kMR, kMR));
  }
  for (std::int64_t k = 0; k < K; ++k) {
    const float* row = src + k * ld;
    if (k + 8 < K) {  // the group's 192 bytes of the row 8 rows on
      const char* ahead = reinterpret_cast<const char*>(row + 8 * ld);
      for (int l = 0; l < 4; ++l) _mm_prefetch(ahead + std::min<std::int64_t>(64 * l, ns * kMR * 4 - 4), _MM_HINT_T0);
    }
    for (std::int64_t t = 0; t < ns; ++t) {
      const float* p = row + t * kMR;
      const __m256 x = t * kMR + 8 <= rows ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask[t]);
      float* o = out + t * kMR * K + k * kMR;
      if (k + 1 < K) {
        _mm256_storeu_ps(o, x);
      } else {
        alignas(32) float last[8];
        _mm256_store_ps(last, x);
        std::memcpy(o, last, sizeof(float) * kMR);
      }
      sum[t] = _mm256_add_ps(sum[t], x);  // lanes 6 and 7 are not rows of the strip: dropped below
    }
  }
  if (!row_sum) return;
  for (std::int64_t t = 0; t < ns; ++t) {
    alignas(32) float s[8];
    _mm256_store_ps(s, sum[t]);
    for (std::int64_t r = 0; r < std::min<std::int64_t>(rows - t * kMR, kMR); ++r) row_sum[t * kMR + r] += s[r];
  }
}

// The AVX2 kernel set for gemm_f32_blocked (gemm_driver.h).
struct Avx2F32 {
  static constexpr std::int64_t MR = kMR, NR = kNR;
  static constexpr bool kBInPlace = false;
  static void pack_at_group(float* out, const float* src, std::int64_t ld, std::int64_t rows, std::int64_t K,
                            float* row_sum) {
    pack_at_group_avx2(out, src, ld, rows, K, row_sum);
  }
  // x = B seen as X(n, k): rows of X contiguous in k (B transposed) are transposed in
  // registers, else each k row is one copy of 16 columns.
  static void pack_b_panel(float* out, const View& x, std::int64_t n0, std::int64_t N, std::int64_t K) {
    const std::int64_t valid = std::min<std::int64_t>(kNR, N - n0);
    if (!x.trans) {
      pack_rows_k_major_16(out, x.p + n0 * x.ld, x.ld, valid, K);
      return;
    }
    copy_rows_16(out, x.p + n0, x.ld, valid, K);
  }
  static void tile(const float* a, std::int64_t rs, std::int64_t ks, const float* b, std::int64_t bs, std::int64_t K,
                   float alpha, float beta, float* c, std::int64_t ldc, std::int64_t mv, std::int64_t nv,
                   const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0) {
    if (nv > 8) micro_kernel_avx2<2>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0);
    else micro_kernel_avx2<1>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0);
  }
};

}  // namespace

void gemm_f32_avx2(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                   const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                   std::int64_t ldc, const GemmEpilogue& ep) {
  gemm_f32_blocked<Avx2F32>(tri, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
}

}  // namespace ds::nn::detail
#endif  // __x86_64__
