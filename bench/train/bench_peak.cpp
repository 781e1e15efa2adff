// Peak arithmetic rate of one core for the three AVX-512 multiply-add forms a GEMM could use
// (CPU time, 12 independent accumulator chains, no memory traffic):
//   fp32 vfmadd231ps (32 FLOP / instruction), bf16 vdpbf16ps (64 FLOP: 16 lanes x 2 pairs,
//   fp32 accumulation), fp16 vfmadd231ph (64 FLOP, fp16 accumulation).
// It bounds what a bf16 GEMM can gain over fp32 on this CPU (see docs/dev/kernels.md, "bf16 GEMMs").
//
// Check: every accumulator sum comes back finite and positive (the loop ran). Headline: the
// bf16 form's FLOP rate over the fp32 FMA's, both measured here (none without AVX512-BF16);
// --min_ratio X fails the run (exit 3) below X. The last line is its JSON: record.
//
//   bench_peak [--min_ratio X]   (prints one line per form; skips the ones the CPU lacks)
#include <immintrin.h>
#include <time.h>

#include <cstdio>

#include <cmath>
#include <string>

#include "ds/core/cpu_features.h"
#include "bench_report.h"

// GCC 12 reports the _mm512_undefined_*() inside its own reduce intrinsics as uninitialized.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The fp16 form needs _Float16 vectors under a target attribute: GCC 12+ (clang 14 wants
// -mavx512fp16 for the whole file).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define DS_PEAK_FP16 1
#else
#define DS_PEAK_FP16 0
#endif

namespace {

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

#define DS_R12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DS_SUM(i) +_mm512_reduce_add_ps(a##i)

__attribute__((target("avx512f,fma"), noinline)) float fp32_fma(long n) {
#define DS_D(i) __m512 a##i = _mm512_set1_ps(float(i));
  DS_R12(DS_D)
  __m512 x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  for (long k = 0; k < n; ++k) {
#define DS_F(i) a##i = _mm512_fmadd_ps(x, y, a##i);
    DS_R12(DS_F)
    __asm__ volatile("" : "+v"(x));  // keeps the loop from being folded
  }
  return 0 DS_R12(DS_SUM);
}

__attribute__((target("avx512f,avx512bf16"), noinline)) float bf16_dot(long n) {
  DS_R12(DS_D)
  __m512bh x = (__m512bh)_mm512_set1_epi32(0x3f803f80), y = x;
  for (long k = 0; k < n; ++k) {
#define DS_B(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    DS_R12(DS_B)
    __asm__ volatile("" : "+v"(x));
  }
  return 0 DS_R12(DS_SUM);
}

#if DS_PEAK_FP16
__attribute__((target("avx512f,avx512fp16"), noinline)) float fp16_fma(long n) {
#define DS_DH(i) __m512h a##i = _mm512_set1_ph((_Float16)(i));
  DS_R12(DS_DH)
  __m512h x = _mm512_set1_ph((_Float16)1.0f), y = x;
  for (long k = 0; k < n; ++k) {
#define DS_H(i) a##i = _mm512_fmadd_ph(x, y, a##i);
    DS_R12(DS_H)
    __asm__ volatile("" : "+v"(x));
  }
#define DS_SUMH(i) +float(_mm512_reduce_add_ph(a##i))
  return 0 DS_R12(DS_SUMH);
}
#endif

bool g_sums_ok = true;  // every accumulator sum finite and positive

template <class F>
double best_gflops(F f, double flop_per_iter, long n) {
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const double t0 = cpu_now();
    volatile float sink = f(n);
    if (!(std::isfinite(float(sink)) && float(sink) > 0)) g_sums_ok = false;
    const double t = cpu_now() - t0;
    if (t > 0 && flop_per_iter * double(n) / t > best) best = flop_per_iter * double(n) / t;
  }
  return best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  double min_ratio = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--min_ratio") min_ratio = ds::bench::parse_min_ratio("bench_peak", i + 1 < argc ? argv[++i] : "");
    else {
      std::fprintf(stderr, "bench_peak: error: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  ds::bench::Report report("bench_peak");
  report.min_ratio(min_ratio);
  const auto& cf = ds::cpu_features();
  const long n = 20000000;
  if (!cf.avx512f || !cf.fma) {
    std::printf("no AVX-512: nothing to measure\n");
    report.headline("none: no AVX-512", std::nan(""));
    return report.finish();
  }
  const double f32 = best_gflops(fp32_fma, 12 * 32, n);
  std::printf("fp32 vfmadd231ps: %.1f GFLOP/s per core (CPU time)\n", f32);
  report["fp32_fma_gflops"] = f32;
  double bf16_ratio = std::nan("");
  if (cf.avx512_bf16) {
    const double b = best_gflops(bf16_dot, 12 * 64, n);
    std::printf("bf16 vdpbf16ps:   %.1f GFLOP/s (%.2fx fp32)\n", b, b / f32);
    report["bf16_dot_gflops"] = b;
    bf16_ratio = b / f32;
  }
  if (DS_PEAK_FP16 && cf.avx512_fp16) {
#if DS_PEAK_FP16
    const double h = best_gflops(fp16_fma, 12 * 64, n);
    std::printf("fp16 vfmadd231ph: %.1f GFLOP/s (%.2fx fp32; fp16 accumulation)\n", h, h / f32);
    report["fp16_fma_gflops"] = h;
#endif
  }
  report.check("every accumulator sum is finite and positive", g_sums_ok, g_sums_ok ? "all sums finite and > 0" : "a sum was not");
  report.headline("bf16 vdpbf16ps FLOP rate / fp32 FMA FLOP rate", bf16_ratio);
  return report.finish();
}
