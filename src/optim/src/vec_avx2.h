// The AVX2 + FMA + F16C row of the optimizer kernels' vector interface (8 fp32 lanes). The
// interface is vec_avx512.h's; here a lane mask is a vector of all-ones / zero lanes plus
// their count, fp32 tails go through vmaskmov and 16-bit tails through a small stack copy
// (AVX2 has no 16-bit masked moves). Division is the exact vdivps: the AVX-512 kernels' fast
// reciprocal path needs rcp14 and fpclass, and the divider here (8 lanes in a few cycles)
// stays under the memory rate. Private header; called only when ds::cpu_isa() is avx2 or
// higher (kernels_avx2.cpp).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ds/core/bf16_simd.h"
#include "simd.h"

namespace ds::optim::simd {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

struct Avx2 {
  using F = __m256;
  struct Mask {
    __m256i lanes;
    unsigned count;
  };
  using D = __m256d;
  static constexpr std::size_t kLanes = 8;

  static Mask full() { return {_mm256_set1_epi32(-1), 8}; }
  static Mask mask_for(std::size_t left) {
    if (left >= 8) return full();
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return {_mm256_cmpgt_epi32(_mm256_set1_epi32(int(left)), iota), unsigned(left)};
  }
  static bool is_full(const Mask& k) { return k.count == 8; }

  static F set1(float x) { return _mm256_set1_ps(x); }
  static F zero() { return _mm256_setzero_ps(); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F zero_masked(const Mask& k, F x) { return _mm256_and_ps(x, _mm256_castsi256_ps(k.lanes)); }

  static F load(const float* p, const Mask& k) {
    return is_full(k) ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, k.lanes);
  }
  static void store(float* p, const Mask& k, F x) {
    if (is_full(k)) _mm256_storeu_ps(p, x);
    else _mm256_maskstore_ps(p, k.lanes, x);
  }

  // 8 16-bit values; a tail is copied through a zeroed stack vector.
  static __m128i load16(const void* base, std::size_t i, const Mask& k) {
    const std::uint16_t* a = static_cast<const std::uint16_t*>(base) + i;
    if (is_full(k)) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(a));
    alignas(16) std::uint16_t tmp[8] = {};
    std::memcpy(tmp, a, k.count * sizeof(std::uint16_t));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(tmp));
  }
  static void store16(void* base, std::size_t i, __m128i h, const Mask& k, bool nt) {
    std::uint16_t* a = static_cast<std::uint16_t*>(base) + i;
    if (is_full(k)) {
      if (nt) _mm_stream_si128(reinterpret_cast<__m128i*>(a), h);
      else _mm_storeu_si128(reinterpret_cast<__m128i*>(a), h);
      return;
    }
    alignas(16) std::uint16_t tmp[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(tmp), h);
    std::memcpy(a, tmp, k.count * sizeof(std::uint16_t));
  }

  template <DType G>
  static F load_g(const void* base, std::size_t i, const Mask& k) {
    if constexpr (G == DType::F32) return load(static_cast<const float*>(base) + i, k);
    else if constexpr (G == DType::F16) return _mm256_cvtph_ps(load16(base, i, k));
    else return bf16x8_to_f32(load16(base, i, k));
  }

  // Round to nearest even, NaN stays (quiet) NaN: identical to ds::float_to_f16 / float_to_bf16.
  // (kBf16Native never reaches this row: simd::dispatch maps it to BF16 below avx512.)
  template <DType W>
  static void store_w(void* base, std::size_t i, F x, const Mask& k, bool nt = false) {
    if constexpr (W == DType::F32) {
      float* a = static_cast<float*>(base) + i;
      if (nt && is_full(k)) _mm256_stream_ps(a, x);
      else store(a, k, x);
    } else if constexpr (W == DType::F16) {
      store16(base, i, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), k, nt);
    } else if constexpr (W == DType::BF16 || W == kBf16Native) {
      store16(base, i, f32x8_to_bf16_rne(x), k, nt);
    }
  }

  // bf16 by truncation, the cheapest 16-bit write: only the benchmark's memory-limit kernel.
  static void store_bf16_truncated(void* base, std::size_t i, F x, const Mask& k, bool nt) {
    const __m256i r = _mm256_srli_epi32(_mm256_castps_si256(x), 16);
    store16(base, i, _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08)), k, nt);
  }

  static D zero_d() { return _mm256_setzero_pd(); }
  // Adds the 8 fp32 lanes of x into two double accumulators (4 lanes each).
  static void acc_f32(F x, D& a0, D& a1) {
    a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(x)));
    a1 = _mm256_add_pd(a1, _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)));
  }
  static double reduce(D a0, D a1) {
    const __m256d s = _mm256_add_pd(a0, a1);
    const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
    return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  }
  static void sfence() { _mm_sfence(); }
};

#pragma GCC pop_options

}  // namespace ds::optim::simd
#endif  // __x86_64__
