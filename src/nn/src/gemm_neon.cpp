// fp32 GEMM with aarch64 NEON: the kernel set for arm64 CPUs (Grace, Graviton, Ampere), run by
// the same blocked driver as the x86 kernels (gemm_driver.h) with the same fused epilogue
// (bias, residual, 16-bit gradient accumulation, row sums of op(A)).
//
// Register tile 8 x 12: 24 q-register accumulators and three B vectors per k. Where a strip's
// 8 values at one k are contiguous (a packed or in-place transposed A, full strips) they are
// two vector loads used lane by lane (fmla by element); otherwise each row's value is one
// scalar load. Either way a k step is 24 FMAs against 3 B loads. op(B) is packed into
// 12-column k-major panels (4 x 4 register transposes when its k is contiguous) or read in
// place; a long transposed A is packed into [k][8] strips, eight strips at a time, summing
// its rows on the way. Advanced SIMD is part of aarch64: no target attributes are needed.
#include "gemm_driver.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "ds/core/bf16_simd.h"

namespace ds::nn::detail {
namespace {

constexpr std::int64_t kMR = 8;
constexpr std::int64_t kNR = 12;
constexpr int kNV = 3;  // 4-lane vectors per tile row

// h[0, cols) = round(h + v) in bf16 or fp16 storage, round to nearest even (as the x86
// epilogues): bf16 by integer rounding, fp16 by fcvtn. A partial vector goes through a
// small buffer (NEON has no masked loads).
inline void half_accumulate4(std::uint16_t* h, std::int64_t cols, float32x4_t v, bool bf16) {
  std::uint16_t part[4] = {};
  std::uint16_t* io = cols >= 4 ? h : part;
  if (cols < 4) std::memcpy(part, h, std::size_t(cols) * 2);
  const uint16x4_t old = vld1_u16(io);
  const uint16x4_t out =
      bf16 ? f32x4_to_bf16_rne(vaddq_f32(bf16x4_to_f32(old), v))
           : vreinterpret_u16_f16(vcvt_f16_f32(vaddq_f32(vcvt_f32_f16(vreinterpret_f16_u16(old)), v)));
  vst1_u16(io, out);
  if (cols < 4) std::memcpy(h, part, std::size_t(cols) * 2);
}

// c[0, cols) = alpha acc + beta c, then + bias, + add (null: skipped): the x86 store_tile's
// operations in its order (beta c fused into the product's sum), so the same bits per element.
// A partial vector is stored lane by lane with the same scalar operations.
inline void store_vec(float32x4_t acc, std::int64_t cols, float alpha, float beta, float* c, const float* bias,
                      const float* add) {
  if (cols >= 4) {
    float32x4_t v = vmulq_n_f32(acc, alpha);
    if (beta != 0.0f) v = vfmaq_n_f32(v, vld1q_f32(c), beta);
    if (bias) v = vaddq_f32(v, vld1q_f32(bias));
    if (add) v = vaddq_f32(v, vld1q_f32(add));
    vst1q_f32(c, v);
    return;
  }
  float lanes[4];
  vst1q_f32(lanes, acc);
  for (std::int64_t i = 0; i < cols; ++i) {
    float v = lanes[i] * alpha;
    if (beta != 0.0f) v = std::fma(c[i], beta, v);
    if (bias) v += bias[i];
    if (add) v += add[i];
    c[i] = v;
  }
}

// The valid mv x nv corner of the tile (the accumulators as stored after the k loop) stored
// with alpha, beta and the epilogue; c points at the tile's (0, 0), bias / add / half_c are
// indexed by its origin (m0, n0t) in C.
inline void store_tile12(const float (&tile)[kMR][kNR], float alpha, float beta, float* c, std::int64_t ldc,
                         std::int64_t mv, std::int64_t nv, const GemmEpilogue& ep, std::int64_t m0,
                         std::int64_t n0t) {
  for (std::int64_t r = 0; r < mv; ++r)
    for (int j = 0; j < kNV; ++j) {
      const std::int64_t n0 = 4 * j, cols = std::min<std::int64_t>(4, nv - n0);
      if (cols <= 0) break;
      if (ep.half_c) {  // 16-bit storage, beta 1 (checked by the caller), no bias / add
        std::uint16_t* h = static_cast<std::uint16_t*>(ep.half_c) + (m0 + r) * ldc + n0t + n0;
        half_accumulate4(h, cols, vmulq_n_f32(vld1q_f32(&tile[r][n0]), alpha), ep.half_bf16);
        continue;
      }
      store_vec(vld1q_f32(&tile[r][n0]), cols, alpha, beta, c + r * ldc + n0, ep.bias ? ep.bias + n0t + n0 : nullptr,
                ep.add ? ep.add + (m0 + r) * ep.ld_add + n0t + n0 : nullptr);
    }
}

// acc[r0 + l][j] += a[l] * b[j] for the 4 lanes l of a (fmla by element).
template <int NV>
inline void fma_4_rows(float32x4_t (&acc)[kMR][kNV], int r0, float32x4_t a, const float32x4_t (&b)[NV]) {
#pragma GCC unroll 3
  for (int j = 0; j < NV; ++j) {
    acc[r0 + 0][j] = vfmaq_laneq_f32(acc[r0 + 0][j], b[j], a, 0);
    acc[r0 + 1][j] = vfmaq_laneq_f32(acc[r0 + 1][j], b[j], a, 1);
    acc[r0 + 2][j] = vfmaq_laneq_f32(acc[r0 + 2][j], b[j], a, 2);
    acc[r0 + 3][j] = vfmaq_laneq_f32(acc[r0 + 3][j], b[j], a, 3);
  }
}

// NV = 4-column vectors the tile computes (a causal C skips those wholly above the
// diagonal). A element (r, k) at a[r * rs + k * ks]: with kAVec the strip's 8 rows at k are
// contiguous (rs == 1, mv == 8), else rows past mv repeat the last valid row (not stored).
// B's 12 columns of row k at b + k * bs.
template <int NV, bool kAVec>
void micro_kernel_neon(const float* __restrict a, std::int64_t rs, std::int64_t ks, const float* __restrict b,
                       std::int64_t bs, std::int64_t K, float alpha, float beta, float* c, std::int64_t ldc,
                       std::int64_t mv, std::int64_t nv, const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0) {
  float32x4_t acc[kMR][kNV];
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < kNV; ++j) acc[r][j] = vdupq_n_f32(0.0f);
  const float* ar[kMR];
  for (int r = 0; r < kMR; ++r) ar[r] = a + std::min<std::int64_t>(r, mv - 1) * rs;
  for (std::int64_t k = 0; k < K; ++k) {
    float32x4_t bv[NV];
#pragma GCC unroll 3
    for (int j = 0; j < NV; ++j) bv[j] = vld1q_f32(b + k * bs + 4 * j);
    if constexpr (kAVec) {
      fma_4_rows<NV>(acc, 0, vld1q_f32(a + k * ks), bv);
      fma_4_rows<NV>(acc, 4, vld1q_f32(a + k * ks + 4), bv);
    } else {
#pragma GCC unroll 8
      for (int r = 0; r < kMR; ++r) {
        const float av = ar[r][k * ks];
#pragma GCC unroll 3
        for (int j = 0; j < NV; ++j) acc[r][j] = vfmaq_n_f32(acc[r][j], bv[j], av);
      }
    }
  }
  // The accumulators leave their registers once, here, by constant indices: the epilogue's
  // run-time row and column counts indexing acc itself made GCC keep acc in memory and store
  // it on every k step.
  float tile[kMR][kNR];
#pragma GCC unroll 8
  for (int r = 0; r < kMR; ++r)
#pragma GCC unroll 3
    for (int j = 0; j < kNV; ++j) vst1q_f32(&tile[r][4 * j], acc[r][j]);
  store_tile12(tile, alpha, beta, c, ldc, mv, std::min<std::int64_t>(nv, 4 * NV), ep, m0, n0);
}

// 4 x 4 transpose in registers.
inline void transpose4(float32x4_t (&r)[4]) {
  const float32x4_t t0 = vtrn1q_f32(r[0], r[1]), t1 = vtrn2q_f32(r[0], r[1]);
  const float32x4_t t2 = vtrn1q_f32(r[2], r[3]), t3 = vtrn2q_f32(r[2], r[3]);
  auto lo = [](float32x4_t x, float32x4_t y) {
    return vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(x), vreinterpretq_f64_f32(y)));
  };
  auto hi = [](float32x4_t x, float32x4_t y) {
    return vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(x), vreinterpretq_f64_f32(y)));
  };
  r[0] = lo(t0, t2);
  r[1] = lo(t1, t3);
  r[2] = hi(t0, t2);
  r[3] = hi(t1, t3);
}

// 12 rows of X (k contiguous: B transposed) into a k-major panel of 12: 4 x 4 blocks
// transposed in registers, rows past `valid` as zeros; the last K % 4 k one by one.
void pack_rows_k_major_12(float* __restrict out, const float* base, std::int64_t ld, std::int64_t valid,
                          std::int64_t K) {
  std::int64_t k0 = 0;
  for (; k0 + 4 <= K; k0 += 4)
    for (std::int64_t c0 = 0; c0 < kNR; c0 += 4) {
      float32x4_t r[4];
      for (int i = 0; i < 4; ++i) r[i] = c0 + i < valid ? vld1q_f32(base + (c0 + i) * ld + k0) : vdupq_n_f32(0.0f);
      transpose4(r);
      for (int t = 0; t < 4; ++t) vst1q_f32(out + (k0 + t) * kNR + c0, r[t]);
    }
  for (; k0 < K; ++k0)
    for (std::int64_t col = 0; col < kNR; ++col) out[k0 * kNR + col] = col < valid ? base[col * ld + k0] : 0.0f;
}

// op(A) = A^T into [k][8] strips, kStripGroup strips at a time (they share each k row's cache
// lines), rows past `rows` as zeros. A full strip's 8 values per k are two vector loads and
// stores and its row sums stay in registers; only the group's last strip can be partial and
// goes value by value.
void pack_at_group_neon(float* __restrict out, const float* src, std::int64_t ld, std::int64_t rows, std::int64_t K,
                        float* row_sum) {
  const std::int64_t ns = std::min<std::int64_t>(kStripGroup, (rows + kMR - 1) / kMR);
  float32x4_t sum[kStripGroup][2];
  float part_sum[kMR] = {};
  for (auto& s : sum) s[0] = s[1] = vdupq_n_f32(0.0f);
  for (std::int64_t k = 0; k < K; ++k) {
    const float* row = src + k * ld;
    if (k + 8 < K) {  // the group's 256 bytes of the row 8 rows on
      const char* ahead = reinterpret_cast<const char*>(row + 8 * ld);
      for (int l = 0; l < 4; ++l) __builtin_prefetch(ahead + std::min<std::int64_t>(64 * l, ns * kMR * 4 - 4));
    }
    for (std::int64_t t = 0; t < ns; ++t) {
      const float* p = row + t * kMR;
      float* o = out + t * kMR * K + k * kMR;
      const std::int64_t valid = std::min<std::int64_t>(rows - t * kMR, kMR);
      if (valid == kMR) {
        const float32x4_t x0 = vld1q_f32(p), x1 = vld1q_f32(p + 4);
        vst1q_f32(o, x0);
        vst1q_f32(o + 4, x1);
        sum[t][0] = vaddq_f32(sum[t][0], x0);
        sum[t][1] = vaddq_f32(sum[t][1], x1);
        continue;
      }
      for (std::int64_t r = 0; r < kMR; ++r) {
        const float x = r < valid ? p[r] : 0.0f;
        o[r] = x;
        part_sum[r] += x;
      }
    }
  }
  if (!row_sum) return;
  for (std::int64_t t = 0; t < ns; ++t) {
    const std::int64_t valid = std::min<std::int64_t>(rows - t * kMR, kMR);
    float s[kMR];
    vst1q_f32(s, sum[t][0]);
    vst1q_f32(s + 4, sum[t][1]);
    for (std::int64_t r = 0; r < valid; ++r) row_sum[t * kMR + r] += valid == kMR ? s[r] : part_sum[r];
  }
}

// The NEON kernel set for gemm_f32_blocked (gemm_driver.h).
struct NeonF32 {
  static constexpr std::int64_t MR = kMR, NR = kNR;
  static constexpr bool kBInPlace = true;
  static void pack_at_group(float* out, const float* src, std::int64_t ld, std::int64_t rows, std::int64_t K,
                            float* row_sum) {
    pack_at_group_neon(out, src, ld, rows, K, row_sum);
  }
  // x = B seen as X(n, k): rows of X contiguous in k (B transposed) are transposed in
  // registers, else each k row is one copy of 12 columns.
  static void pack_b_panel(float* out, const View& x, std::int64_t n0, std::int64_t N, std::int64_t K) {
    const std::int64_t valid = std::min<std::int64_t>(kNR, N - n0);
    if (x.trans) copy_b_rows(out, x, n0, valid, K, kNR);
    else pack_rows_k_major_12(out, x.p + n0 * x.ld, x.ld, valid, K);
  }
  template <bool kAVec>
  static void tile_as(const float* a, std::int64_t rs, std::int64_t ks, const float* b, std::int64_t bs,
                      std::int64_t K, float alpha, float beta, float* c, std::int64_t ldc, std::int64_t mv,
                      std::int64_t nv, const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0) {
    switch ((nv + 3) / 4) {  // a causal C skips the 4-column vectors above the diagonal
      case 1: micro_kernel_neon<1, kAVec>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0); break;
      case 2: micro_kernel_neon<2, kAVec>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0); break;
      default: micro_kernel_neon<3, kAVec>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0); break;
    }
  }
  static void tile(const float* a, std::int64_t rs, std::int64_t ks, const float* b, std::int64_t bs, std::int64_t K,
                   float alpha, float beta, float* c, std::int64_t ldc, std::int64_t mv, std::int64_t nv,
                   const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0) {
    if (rs == 1 && mv == kMR) tile_as<true>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0);
    else tile_as<false>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0);
  }
};

}  // namespace

void gemm_f32_neon(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                   const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                   std::int64_t ldc, const GemmEpilogue& ep) {
  gemm_f32_blocked<NeonF32>(tri, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
}

}  // namespace ds::nn::detail
#endif  // __aarch64__
