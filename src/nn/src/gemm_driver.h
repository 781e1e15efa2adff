// Internal to ds_nn's fp32 GEMMs: the blocked driver every fp32 kernel set shares (gemm.cpp:
// AVX-512, gemm_avx2.cpp: AVX2 + FMA, gemm_neon.cpp: aarch64 NEON). It decides what is
// packed, splits the tiles between threads in gemm_blocking.h's order and applies the
// triangular skips; the kernel set supplies the register tile and its packers:
//
//   struct Set {
//     static constexpr std::int64_t MR, NR;  // register tile: MR rows x NR columns
//     static constexpr bool kBInPlace;  // full panels of a B stored K x N may be read in place
//     // op(A) = A^T into [k][MR] strips, kStripGroup strips from `src`, rows valid of them,
//     // with each row's fp32 sum added into row_sum (when not null).
//     static void pack_at_group(float* out, const float* src, std::int64_t ld, std::int64_t rows,
//                               std::int64_t K, float* row_sum);
//     // op(B) column panel of NR: out[k][c] = op(B)(k, n0 + c), zero past the last column.
//     static void pack_b_panel(float* out, const View& x, std::int64_t n0, std::int64_t N, std::int64_t K);
//     // One tile: A element (r, k) at a[r * rs + k * ks], B row k at b + k * bs; the valid
//     // mv x nv corner stored with alpha, beta and the epilogue (store at C(m0, n0)).
//     static void tile(const float* a, std::int64_t rs, std::int64_t ks, const float* b, std::int64_t bs,
//                      std::int64_t K, float alpha, float beta, float* c, std::int64_t ldc,
//                      std::int64_t mv, std::int64_t nv, const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0);
//   };
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "gemm_tile.h"

namespace ds::nn::detail {

template <class Set>
void gemm_f32_blocked(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                      float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                      float* C, std::int64_t ldc, const GemmEpilogue& ep) {
  constexpr std::int64_t R = Set::MR, W = Set::NR;
  if (M <= 0 || N <= 0) return;
  const std::int64_t mp = (M + R - 1) / R, np = (N + W - 1) / W;
  const std::int64_t Kp = std::max<std::int64_t>(K, 1);
  float* pb = reinterpret_cast<float*>(ensure(1, std::size_t(np * W * Kp)));
  const View vb{B, ldb, !trans_b};
  // op(A) is read in place; a transposed A with a long k is packed into [k][MR] panels
  // first (each k step of A^T in place is a new cache line, and lda = 1024 floats would
  // also alias in L1).
  const bool pack_a = trans_a && K > 256;
  float* pa = pack_a ? reinterpret_cast<float*>(ensure(0, std::size_t(mp * R * Kp))) : nullptr;
  // op(B) with rows contiguous in n (B not transposed) is read in place, where the kernel set
  // allows it (the AVX2 set packs every panel: at the dinp shapes packed measured 0.95-1.01
  // of OpenBLAS in three interleaved runs, in place 0.85-1.14), for every full
  // column panel (its k rows are ldb apart instead of NR: no copy), unless ldb is a
  // multiple of 512 floats (rows 2 KiB apart share a few L1 sets: measured 143 against 152
  // GFLOP/s packed at ldb = 1024 with AVX-512), or A is packed too: the weight gradients
  // (A = dout^T) with B packed measured 3% faster in the step (sum of the per-op minima of the
  // Linear backwards, 6 interleaved runs, AMD EPYC: 76.1 -> 73.6 ms) and 2-20% at the bench
  // shapes in isolation. A partial last panel and a transposed B are always packed.
  const bool b_rows_ok = Set::kBInPlace && !trans_b && ldb % 512 != 0 && !pack_a;
  auto b_in_place = [&](std::int64_t j) { return b_rows_ok && (j + 1) * W <= N; };
  const View va{A, lda, trans_a};
  const bool par = !omp_in_parallel() && M * N * Kp > (1 << 21);
  auto run = [&](bool team) {
    // One MR x NR tile of C: row strip i, column panel j.
    auto tile = [&](std::int64_t i, std::int64_t j) {
      const std::int64_t m0 = i * R, n0 = j * W, mv = std::min(R, M - m0);
      std::int64_t nv = std::min(W, N - n0), k0 = 0, k1 = K;
      if (tri == Tri::LowerC) {  // columns past the tile's last row are not needed
        nv = std::min(nv, m0 + mv - n0);
        if (nv <= 0) return;
      } else if (tri == Tri::LowerA) {  // op(A)(m, k) = 0 for k > m
        k1 = std::min(K, m0 + mv);
      } else if (tri == Tri::UpperA) {  // op(A)(m, k) = 0 for k < m
        k0 = std::min(K, m0);
      }
      const float* a = pack_a ? pa + i * R * K + k0 * R : trans_a ? A + k0 * lda + m0 : A + m0 * lda + k0;
      const std::int64_t rs = pack_a ? 1 : trans_a ? 1 : lda, ks = pack_a ? R : trans_a ? lda : 1;
      const bool bip = b_in_place(j);
      const float* b = bip ? B + k0 * ldb + n0 : pb + j * W * K + k0 * W;
      const std::int64_t bs = bip ? ldb : W;
      float* c = ep.half_c ? nullptr : C + m0 * ldc + n0;
      Set::tile(a, rs, ks, b, bs, k1 - k0, alpha, beta, c, ldc, mv, nv, ep, m0, n0);
    };
    // A transposed A is packed whole before any tile (packing a strip group just before its
    // tiles measured 3-6% slower: the 4 KiB-strided reads evict B's lines from the L2).
    if (pack_a) {
      for_range(team, true, 0, mp, kStripGroup, [&](std::int64_t g) {
        Set::pack_at_group(pa + g * R * K, A + g * R, lda, M - g * R, K, ep.a_row_sum ? ep.a_row_sum + g * R : nullptr);
      });
    } else if (ep.a_row_sum) {
      for_range(team, true, 0, M, 1, [&](std::int64_t i) {
        float s = 0.0f;
        for (std::int64_t k = 0; k < K; ++k) s += va.at(i, k);
        ep.a_row_sum[i] += s;
      });
    }
    for_range(team, false, 0, np, 1, [&](std::int64_t j) {
      if (!b_in_place(j)) Set::pack_b_panel(pb + j * W * K, vb, j * W, N, K);
    });
    for_each_tile(team, mp, np, std::uint64_t(Kp) * W * sizeof(float), tile);
  };
  run_gemm(par, run);
}

#if defined(__x86_64__)
// The AVX2 + FMA set's instance (gemm_avx2.cpp), called by gemm.cpp's dispatch.
void gemm_f32_avx2(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                   const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                   std::int64_t ldc, const GemmEpilogue& ep);
#endif
#if defined(__aarch64__)
// The NEON set's instance (gemm_neon.cpp), called by gemm.cpp's dispatch.
void gemm_f32_neon(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K, float alpha,
                   const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta, float* C,
                   std::int64_t ldc, const GemmEpilogue& ep);
#endif

}  // namespace ds::nn::detail
