// GEMM front door for the layers: C = alpha * op(A) op(B) + beta * C, row-major fp32 in and
// out, op(A) M x K, op(B) K x N.
//
// gemm(Precision::F32): OpenBLAS cblas_sgemm when OpenBLAS runs a kernel as wide as the CPU
// kernel set in use (ds::cpu_isa()); else our own FMA kernel for that set: AVX-512 (6 x 64
// register tile), AVX2 + FMA (6 x 16) or NEON (8 x 12), B packed, A read in place. Debian's
// OpenBLAS 0.3.21 does not know newer CPU models and falls back to its SSE3 "Prescott" kernel
// (~1/4 of the AVX-512 rate) unless OPENBLAS_CORETYPE (SkylakeX, Haswell) is in the
// environment before the program starts. DS_NN_GEMM=openblas|own overrides the choice; on
// the plain set, and on neon (every arm64 OpenBLAS kernel is NEON or SVE), OpenBLAS. The layers call the own kernels directly for all their GEMMs
// (gemm_epilogue: forward, input and weight gradients) and the triangular one for attention
// (gemm_tri); see docs/dev/kernels.md.
// Precision::BF16 rounds A and B to bfloat16 (round to nearest even) while packing them and
// multiplies with AVX512-BF16 `vdpbf16ps`, accumulating in fp32 (that OpenBLAS is built
// without cblas_sbgemm). Without AVX512-BF16 a BF16 request runs fp32. Whether it pays
// depends on the CPU (bench/train/bench_peak measured vdpbf16ps from 0.49x to 1.8x the FLOP
// rate of fp32 FMA on the CPUs tried), so layer_precision() follows kernels.cpu_bf16_gemm,
// whose "auto" times both kernels on this CPU (below).
// Safe to call from several threads at once (per-thread packing buffers).
#pragma once

#include <cstdint>
#include <string_view>

namespace ds::nn {

enum class Precision { F32, BF16 };

// Whether Precision::BF16 really runs bf16 products on this CPU.
bool bf16_gemm_supported();

void gemm(Precision p, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
          float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
          float* C, std::int64_t ldc);

// kernels.cpu_bf16_gemm: whether bf16 working parameters compute their Linear GEMMs in bf16.
enum class CpuBf16Gemm { Auto, On, Off };
// "auto", "on" or "off"; anything else throws ds::Error naming `what` (the key).
CpuBf16Gemm parse_cpu_bf16_gemm(std::string_view text, std::string_view what);

// The measurement behind "auto", made once per process (the first call; a few milliseconds
// on the calling thread): the best of kBf16GemmRuns interleaved runs of the own fp32 and
// bf16 kernels at one fixed single-threaded shape. bf16 is chosen when it is at least
// kBf16GemmMinSpeedup times faster. faster is false (and nothing is timed) without
// AVX512-BF16 or AVX-512.
inline constexpr double kBf16GemmMinSpeedup = 1.25;
inline constexpr int kBf16GemmRuns = 15;
struct Bf16GemmTiming {
  double f32_seconds = 0, bf16_seconds = 0;
  bool faster = false;
};
const Bf16GemmTiming& measure_bf16_gemm();

// This process's choice for a mode: On = the CPU has AVX512-BF16, Off = false, Auto =
// measure_bf16_gemm().faster. Ranks must agree on it before they use it (the train app takes
// the minimum over the ranks): a measurement can differ between machines.
bool cpu_bf16_gemm_choice(CpuBf16Gemm mode);

// Fixes the choice layer_precision() applies for the rest of the process (the train app
// calls it with the ranks' agreed value). Until it is called: the "auto" choice of this
// process alone.
void set_cpu_bf16_gemm(bool use_bf16);

// The GEMM precision the built-in models give their Linear layers for a working dtype: BF16
// when the working parameters are bf16, the choice above says bf16 and the CPU has
// AVX512-BF16, else F32. fp16 working parameters stay F32 (bf16 holds fewer mantissa bits
// than fp16).
Precision layer_precision(bool bf16_working);

// The bf16 kernel itself (requires bf16_gemm_supported()); exposed for tests and benchmarks.
void gemm_bf16(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
               float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
               float beta, float* C, std::int64_t ldc);

// The same blocking with fp32 FMA (AVX-512, AVX2 or NEON, by the kernel set in use); requires
// f32_gemm_supported(): the set in use is avx512, avx2 or neon.
bool f32_gemm_supported();
// Whether Precision::F32 goes to OpenBLAS (see above).
bool use_openblas_f32();
void gemm_f32(bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
              float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
              float beta, float* C, std::int64_t ldc);

// The layers' GEMM: the own kernel of precision p (the bf16 one for BF16 on a CPU with
// AVX512-BF16, else the fp32 one, which needs f32_gemm_supported()) with a fused epilogue,
// applied after alpha/beta on every C element: + bias[n], + add[m * ld_add + n] (null
// pointers skip a step). The layers use it for all their GEMMs when own_gemm_for_layers(p)
// (fp32: f32_gemm_supported() and DS_NN_GEMM is not "openblas"; rates at the layer shapes:
// bench/train/bench_gemm_shapes).
// a_row_sum (not an epilogue step: read while op(A) is packed): row_sum[m] += sum over k of
// op(A)(m, k), i.e. the bias gradient when the GEMM is a weight gradient dout^T x inp; the
// bf16 kernel sums the fp32 values, before rounding.
// half_c: the result accumulates into 16-bit storage instead of C (C is not touched and may
// be null): half_c[m * ldc + n] = round(half_c[m * ldc + n] + alpha * acc) to bf16
// (half_bf16) or fp16, round to nearest even: the same bits as computing alpha * acc in fp32
// and adding it afterwards. beta must be 1; not combined with bias / add.
struct GemmEpilogue {
  const float* bias = nullptr;
  const float* add = nullptr;
  std::int64_t ld_add = 0;
  float* a_row_sum = nullptr;
  void* half_c = nullptr;
  bool half_bf16 = true;
};
bool own_f32_for_layers();
bool own_gemm_for_layers(Precision p);
void gemm_epilogue(Precision p, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
                   float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb, float beta,
                   float* C, std::int64_t ldc, const GemmEpilogue& ep);

// Triangular-structure fp32 GEMM for causal attention (own kernel; without one the full
// product through gemm(F32), which gives the same defined values):
//   LowerC: only C(m, n) with n <= m is needed; C above the diagonal is unspecified (some of
//           it is written, in 16-column steps). alpha/beta apply as usual below it.
//   LowerA: op(A)(m, k) must be zero for k > m; most of those entries are skipped.
//   UpperA: op(A)(m, k) must be zero for k < m; most of those entries are skipped.
// The work left is about half of the full product for square triangles.
enum class Tri { None, LowerC, LowerA, UpperA };
void gemm_tri(Tri tri, bool trans_a, bool trans_b, std::int64_t M, std::int64_t N, std::int64_t K,
              float alpha, const float* A, std::int64_t lda, const float* B, std::int64_t ldb,
              float beta, float* C, std::int64_t ldc);

}  // namespace ds::nn
