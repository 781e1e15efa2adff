// fp32 GEMMs with AVX-512 FMA (see ds/nn/gemm.h) and the front door that picks a kernel
// (AVX-512 here, AVX2 + FMA in gemm_avx2.cpp, NEON in gemm_neon.cpp, else OpenBLAS).
//
// The blocked driver (gemm_driver.h) packs B into 64-column k-major panels (or reads it in
// place) and reads A in place (a long transposed A packed into [k][MR] strips); the 6 x 64
// register tile and its epilogue are in gemm_tile.h, shared with the bf16 kernel
// (gemm_bf16.cpp).
#include "ds/nn/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "ds/core/cpu_features.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "gemm_driver.h"

namespace ds::nn {
namespace {

using namespace detail;

// A BF16 request runs the bf16 kernel where the CPU has AVX512-BF16, else fp32.
bool runs_bf16(Precision p) { return p == Precision::BF16 && bf16_gemm_supported(); }

#if defined(__x86_64__)
// Rows of X (k contiguous) into a k-major panel of 64: 16 x 16 blocks transposed in
// registers, rows past `valid` as zeros.
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void pack_rows_k_major_64(
    float* __restrict out, const float* base, std::int64_t ld, std::int64_t valid, std::int64_t K) {
  for (std::int64_t k0 = 0; k0 < K; k0 += 16) {
    const std::int64_t kw = std::min<std::int64_t>(16, K - k0);
    const __mmask16 km = __mmask16(kw >= 16 ? 0xFFFF : (1u << kw) - 1);
    for (int j = 0; j < 4; ++j) {
      __m512 r[16];
      for (int i = 0; i < 16; ++i) {
        const std::int64_t row = 16 * j + i;
        r[i] = row < valid ? _mm512_maskz_loadu_ps(km, base + row * ld + k0) : _mm512_setzero_ps();
      }
      transpose16(r);
      for (std::int64_t t = 0; t < kw; ++t) _mm512_storeu_ps(out + (k0 + t) * 64 + 16 * j, r[t]);
    }
  }
}

// op(A) = A^T into [k][MR] panels, kStripGroup strips at a time: the MR values of a strip at
// one k are contiguous in A, so each k row of A gives one masked 256-bit load and store per
// strip, and the group's strips share the row's cache lines. (One strip at a time walked a
// new 4 KiB page per k for every strip: a dW GEMM at the model's shapes lost ~20% to it.)
// With row_sum, also adds each row's sum over k into row_sum[0, rows): the bias gradient of
// a weight-gradient GEMM, read on the way.
//
// A full group (kStripGroup whole strips) takes the fast path: its row sums stay in registers
// and the stores are plain 8-float ones, each overlapping the next k's first two floats (which
// that store then writes), but for the last k; only the last strip's load is masked (its
// 8 floats would read past the group). The masked form spilled the sums and measured ~15%
// of a weight-gradient GEMM (1 thread, 768 x 256 x 1024).
constexpr std::int64_t kPackAhead = 8;
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void pack_at_full_group(
    float* __restrict out, const float* src, std::int64_t ld, std::int64_t K, float* row_sum) {
  constexpr std::int64_t G = kStripGroup;
  const __mmask8 six = __mmask8((1u << MR) - 1);
  __m256 sum[G];
#pragma GCC unroll 8
  for (std::int64_t t = 0; t < G; ++t) sum[t] = _mm256_setzero_ps();
  for (std::int64_t k = 0; k < K; ++k) {
    const float* row = src + k * ld;
    const bool last = k + 1 == K;
    if (k + kPackAhead < K) {  // the group's 192 bytes of a row kPackAhead rows on (4 lines at most)
      const char* ahead = reinterpret_cast<const char*>(row + kPackAhead * ld);
      for (int l = 0; l < 4; ++l) _mm_prefetch(ahead + std::min<std::int64_t>(64 * l, G * MR * 4 - 4), _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (std::int64_t t = 0; t < G; ++t) {
      const __m256 x = t + 1 < G ? _mm256_loadu_ps(row + t * MR) : _mm256_maskz_loadu_ps(six, row + t * MR);
      float* o = out + t * MR * K + k * MR;
      if (last) _mm256_mask_storeu_ps(o, six, x);
      else _mm256_storeu_ps(o, x);
      sum[t] = _mm256_mask_add_ps(sum[t], six, sum[t], x);
    }
  }
  if (!row_sum) return;
  for (std::int64_t t = 0; t < G; ++t) add_row_sum(row_sum + t * MR, six, sum[t]);
}

__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void pack_at_group(
    float* __restrict out, const float* src, std::int64_t ld, std::int64_t rows, std::int64_t K,
    float* row_sum) {
  static_assert(MR == 6 && kStripGroup == 8, "pack_at_full_group's 8-float stores cover one strip's k step");
  if (rows >= kStripGroup * MR) {
    pack_at_full_group(out, src, ld, K, row_sum);
    return;
  }
  StripGroup g;
  init_strip_group(g, rows);
  const __mmask8 full = __mmask8((1u << MR) - 1);
  for (std::int64_t k = 0; k < K; ++k) {
    const float* row = src + k * ld;
#pragma GCC unroll 8
    for (std::int64_t t = 0; t < kStripGroup; ++t) {
      if (t >= g.ns) break;
      const __m256 x = _mm256_maskz_loadu_ps(g.mask[t], row + t * MR);
      _mm256_mask_storeu_ps(out + t * MR * K + k * MR, full, x);
      g.sum[t] = _mm256_add_ps(g.sum[t], x);
    }
  }
  add_row_sums(g, row_sum);
}

// op(B) column panel of NR = 64: out[k][c] = op(B)(k, n0 + c), zero past the last column.
// View x = B seen as X(n, k) (see gemm_f32_impl): rows of X contiguous in k (B transposed)
// go through the register transposes, else each k row is one copy.
void pack_b_panel(float* out, const View& x, std::int64_t n0, std::int64_t N, std::int64_t K) {
  const std::int64_t valid = std::min<std::int64_t>(NR, N - n0);
  if (!x.trans) {
    pack_rows_k_major_64(out, x.p + n0 * x.ld, x.ld, valid, K);
    return;
  }
  for (std::int64_t k = 0; k < K; ++k) {
    const float* src = x.p + k * x.ld + n0;
    float* o = out + k * NR;
    if (valid == NR) {
      std::memcpy(o, src, sizeof(float) * NR);
    } else {
      for (std::int64_t r = 0; r < NR; ++r) o[r] = r < valid ? src[r] : 0.0f;
    }
  }
}

// NV = number of 16-wide column vectors the tile computes (1..4): a causal (lower
// triangular) C skips the vectors wholly above the diagonal. A is read in place (no
// packing: the broadcasts come from L1/L2 either way): element (r, k) of the tile at
// a[r * rs + k * ks]; rows past mv repeat the last valid row (their results are not stored).
// B: the tile's 64 columns of row k at b + k * bs (a packed panel: bs = 64).
template <int NV>
__attribute__((target("avx512f,avx512bw,avx512vl,fma"))) void micro_kernel_f32(
    const float* __restrict a, std::int64_t rs, std::int64_t ks, const float* __restrict b, std::int64_t bs,
    std::int64_t K, float alpha, float beta, float* c, std::int64_t ldc, std::int64_t mv, std::int64_t nv,
    const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0) {
  __m512 acc[MR][4];
  const float* ar[MR];
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    ar[r] = a + std::min<std::int64_t>(r, mv - 1) * rs;
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_setzero_ps();
  }
  for (std::int64_t k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) bv[j] = _mm512_loadu_ps(b + k * bs + 16 * j);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m512 av = _mm512_set1_ps(ar[r][k * ks]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[r][j] = _mm512_fmadd_ps(av, bv[j], acc[r][j]);
    }
  }
  store_tile(acc, alpha, beta, c, ldc, mv, std::min<std::int64_t>(nv, 16 * NV), ep, m0, n0);
}

// The AVX-512 kernel set for gemm_f32_blocked (gemm_driver.h).
struct Avx512F32 {
  static constexpr std::int64_t MR = detail::MR, NR = detail::NR;
  static constexpr bool kBInPlace = true;
  static void pack_at_group(float* out, const float* src, std::int64_t ld, std::int64_t rows, std::int64_t K,
                            float* row_sum) {
    ds::nn::pack_at_group(out, src, ld, rows, K, row_sum);
  }
  static void pack_b_panel(float* out, const View& x, std::int64_t n0, std::int64_t N, std::int64_t K) {
    ds::nn::pack_b_panel(out, x, n0, N, K);
  }
  static void tile(const float* a, std::int64_t rs, std::int64_t ks, const float* b, std::int64_t bs, std::int64_t K,
                   float alpha, float beta, float* c, std::int64_t ldc, std::int64_t mv, std::int64_t nv,
                   const GemmEpilogue& ep, std::int64_t m0, std::int64_t n0) {
    switch ((nv + 15) / 16) {  // a causal C skips the 16-column vectors above the diagonal
      case 1: micro_kernel_f32<1>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0); break;
      case 2: micro_kernel_f32<2>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0); break;
      case 3: micro_kernel_f32<3>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0); break;
      default: micro_kernel_f32<4>(a, rs, ks, b, bs, K, alpha, beta, c, ldc, mv, nv, ep, m0, n0); break;
    }
  }
};

#endif  // __x86_64__

}  // namespace


// fp32 GEMMs go to OpenBLAS when it runs a kernel for the kernel set in use or a wider one
// (OpenBLAS 0.3.21 does not know newer CPU models and falls back to its SSE3 "Prescott"
// kernel unless OPENBLAS_CORETYPE, e.g. SkylakeX or Haswell, is set before the program
// starts), else to our own kernel. DS_NN_GEMM=openblas|own forces the choice.
bool use_openblas_f32() {
  const std::string forced = env::get_string("DS_NN_GEMM");
  if (forced == "openblas") return true;
  if (forced == "own") return false;
  if (!f32_gemm_supported() || cpu_isa() == CpuIsa::neon) return true;  // arm64 OpenBLAS cores are all NEON / SVE
  std::string core = openblas_get_corename();
  for (auto& ch : core) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  auto has = [&](const char* name) { return core.find(name) != std::string::npos; };
  const bool avx512_core = has("skylakex") || has("cooperlake") || has("sapphirerapids");
  if (cpu_isa() == CpuIsa::avx512) return avx512_core;
  return avx512_core || has("haswell") || has("zen");
}

bool f32_gemm_supported() {
  const CpuIsa isa = cpu_isa();
  return isa == CpuIsa::avx512 || isa == CpuIsa::avx2 || isa == CpuIsa::neon;
}

namespace {

void gemm_f32_impl(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                   float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
                   float beta, float* C, std::int64_t ldc, const GemmEpilogue& ep = {}) {
  const CpuIsa isa = cpu_isa();
  DS_CHECK(f32_gemm_supported(),
           "gemm_f32: no own fp32 GEMM kernel for the CPU kernel set in use (" << isa_name(isa) << ")");
#if defined(__x86_64__)
  if (isa == CpuIsa::avx512)
    gemm_f32_blocked<Avx512F32>(tri, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
  else
    gemm_f32_avx2(tri, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
#elif defined(__aarch64__)
  gemm_f32_neon(tri, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
#else
  (void)tri, (void)trans_a, (void)trans_b, (void)M, (void)N, (void)K, (void)alpha, (void)A, (void)lda, (void)B;
  (void)ldb, (void)beta, (void)C, (void)ldc, (void)ep;
#endif
}

}  // namespace

void gemm_f32(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
              float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
              float beta, float* C, std::int64_t ldc) {
  gemm_f32_impl(Tri::None, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

bool own_f32_for_layers() {
  static const bool forced_blas = env::get_string("DS_NN_GEMM") == "openblas";
  return !forced_blas && f32_gemm_supported();  // the kernel set is read per call (tests switch it)
}

bool own_gemm_for_layers(Precision p) { return runs_bf16(p) || own_f32_for_layers(); }

void gemm_epilogue(Precision p, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                   float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                   float* C, std::int64_t ldc, const GemmEpilogue& ep) {
  DS_CHECK(!ep.half_c || (beta == 1.0f && !ep.bias && !ep.add),
           "gemm_epilogue: half_c accumulates (beta 1) and takes no bias / add");
  if (runs_bf16(p))
    gemm_bf16_epilogue(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
  else
    gemm_f32_impl(Tri::None, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, ep);
}

void gemm_tri(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
              float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
              float beta, float* C, std::int64_t ldc) {
  if (f32_gemm_supported()) {
    gemm_f32_impl(tri, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  // The full product gives the same values where the triangle is defined (the zero half of
  // a triangular op(A) adds nothing; a LowerC caller ignores the upper part).
  gemm(Precision::F32, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(Precision p, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
          float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
          float* C, std::int64_t ldc) {
  if (runs_bf16(p)) {
    gemm_bf16(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  static const bool use_blas = use_openblas_f32();
  if (!use_blas && f32_gemm_supported()) {
    gemm_f32(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              int(M), int(N), int(K), alpha, A, int(lda), B, int(ldb), beta, C, int(ldc));
}

}  // namespace ds::nn
