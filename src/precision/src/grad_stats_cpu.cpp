// Fast grad_stats: fixed blocks summed in parallel (AVX-512 or AVX2 by ds::cpu_isa(), else
// the plain loop), block sums added in order so the result is the same for any thread count.
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <type_traits>

#include "ds/core/cpu_features.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/precision/grad_stats.h"

namespace ds::precision {
namespace {

constexpr std::size_t kBlock = 65536;

template <typename T>
double block_sum_plain(const T* p, std::size_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  auto val = [](T x) -> double {
    if constexpr (std::is_same_v<T, float>) return double(x);
    else if constexpr (std::is_same_v<T, f16>) return double(f16_to_float(x));
    else return double(bf16_to_float(x));
  };
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    double a = val(p[i]), b = val(p[i + 1]), c = val(p[i + 2]), d = val(p[i + 3]);
    s0 += a * a; s1 += b * b; s2 += c * c; s3 += d * d;
  }
  for (; i < n; ++i) { double a = val(p[i]); s0 += a * a; }
  return (s0 + s1) + (s2 + s3);
}

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,f16c,fma")
template <DType D>
inline __m512 load16(const void* base, std::size_t i, __mmask16 k) {
  if constexpr (D == DType::F32) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(base) + i);
  } else {
    __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const std::uint16_t*>(base) + i);
    if constexpr (D == DType::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType D>
double block_sum_avx512(const void* base, std::size_t begin, std::size_t end) {
  __m512d a0 = _mm512_setzero_pd(), a1 = _mm512_setzero_pd();
  __m512d a2 = _mm512_setzero_pd(), a3 = _mm512_setzero_pd();
  std::size_t i = begin;
  for (; i + 32 <= end; i += 32) {
    __m512 x = load16<D>(base, i, 0xffff), y = load16<D>(base, i + 16, 0xffff);
    __m512d x0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d x1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    __m512d y0 = _mm512_cvtps_pd(_mm512_castps512_ps256(y));
    __m512d y1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(y), 1)));
    a0 = _mm512_fmadd_pd(x0, x0, a0); a1 = _mm512_fmadd_pd(x1, x1, a1);
    a2 = _mm512_fmadd_pd(y0, y0, a2); a3 = _mm512_fmadd_pd(y1, y1, a3);
  }
  for (; i < end; i += 16) {
    const std::size_t left = end - i;
    const __mmask16 k = left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
    __m512 x = load16<D>(base, i, k);
    __m512d x0 = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
    __m512d x1 = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
    a0 = _mm512_fmadd_pd(x0, x0, a0); a1 = _mm512_fmadd_pd(x1, x1, a1);
  }
  return _mm512_reduce_add_pd(_mm512_add_pd(_mm512_add_pd(a0, a1), _mm512_add_pd(a2, a3)));
}
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,f16c,fma")
template <DType D>
inline __m256 load8(const void* base, std::size_t i) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const std::uint16_t*>(base) + i));
    if constexpr (D == DType::F16) return _mm256_cvtph_ps(h);
    else return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

// Sum of squares in double lanes, 16 elements a step; the tail by the plain loop.
template <DType D, typename T>
double block_sum_avx2(const void* base, std::size_t begin, std::size_t end) {
  __m256d a0 = _mm256_setzero_pd(), a1 = _mm256_setzero_pd();
  __m256d a2 = _mm256_setzero_pd(), a3 = _mm256_setzero_pd();
  std::size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    const __m256 x = load8<D>(base, i), y = load8<D>(base, i + 8);
    const __m256d x0 = _mm256_cvtps_pd(_mm256_castps256_ps128(x)), x1 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    const __m256d y0 = _mm256_cvtps_pd(_mm256_castps256_ps128(y)), y1 = _mm256_cvtps_pd(_mm256_extractf128_ps(y, 1));
    a0 = _mm256_fmadd_pd(x0, x0, a0); a1 = _mm256_fmadd_pd(x1, x1, a1);
    a2 = _mm256_fmadd_pd(y0, y0, a2); a3 = _mm256_fmadd_pd(y1, y1, a3);
  }
  const __m256d s = _mm256_add_pd(_mm256_add_pd(a0, a1), _mm256_add_pd(a2, a3));
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  const double vec = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  return vec + block_sum_plain(static_cast<const T*>(base) + i, end - i);
}
#pragma GCC pop_options
#endif  // __x86_64__

template <DType D, typename T>
GradStats run(TensorView g, double multiplier) {
  const std::size_t n = g.count;
  const std::size_t nblocks = (n + kBlock - 1) / kBlock;
  [[maybe_unused]] const CpuIsa isa = cpu_isa();  // DS_CPU_ISA=avx2|plain forces the lower paths (tests cover them)
  auto block = [&](std::size_t b) {
    const std::size_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
#if defined(__x86_64__)
    if (isa == CpuIsa::avx512) return block_sum_avx512<D>(g.data, lo, hi);
    if (isa == CpuIsa::avx2) return block_sum_avx2<D, T>(g.data, lo, hi);
#endif
    return block_sum_plain(g.as<const T>() + lo, hi - lo);
  };
  double total = 0.0;
  if (nblocks <= 1) {
    total = nblocks ? block(0) : 0.0;
  } else {
    std::vector<double> sums(nblocks);
#pragma omp parallel for schedule(static) if (nblocks >= 4)
    for (std::ptrdiff_t b = 0; b < std::ptrdiff_t(nblocks); ++b) sums[b] = block(std::size_t(b));
    for (double s : sums) total += s;
  }
  // Squares of finite floats cannot overflow a double sum, so a non-finite total means
  // an inf or NaN element.
  const bool bad = !std::isfinite(total);
  return {total * multiplier * multiplier, bad};
}

}  // namespace

GradStats grad_stats(TensorView g, double multiplier) {
  switch (g.dtype) {
    case DType::F32: return run<DType::F32, float>(g, multiplier);
    case DType::F16: return run<DType::F16, f16>(g, multiplier);
    case DType::BF16: return run<DType::BF16, bf16>(g, multiplier);
    default: DS_THROW("grad_stats: gradient dtype must be fp32, fp16 or bf16, got " << dtype_name(g.dtype));
  }
}

}  // namespace ds::precision
