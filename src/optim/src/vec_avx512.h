// The AVX-512 row of the optimizer kernels' vector interface (16 fp32 lanes, opmask tails).
// Private header. Every member is compiled for AVX-512 and called only when ds::cpu_isa()
// is avx512 (kernels_avx512.cpp). The interface, shared with vec_avx2.h and vec_neon.h, is what the kernel
// bodies (kernel_bodies.inc) use:
//   F / Mask / D     fp32 vector, lane mask, double accumulator;  kLanes
//   full(), mask_for(left), is_full(k)
//   set1, zero, add, mul, fmadd(a, b, c) = a*b + c (one rounding), sqrt, div, zero_masked(k, x)
//   load(p, k) / store(p, k, x)        fp32, masked lanes not touched (loads give 0)
//   load_g<G>(base, i, k)              gradient element i.. of dtype G as fp32
//   store_w<W>(base, i, x, k, nt)      working copy of dtype W, rounded like ds::float_to_*
//   zero_d, acc_f32(x, a0, a1), reduce(a0, a1), sfence()
//   store_bf16_truncated               the benchmark's memory-limit kernel only
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "ds/core/bf16_simd.h"
#include "simd.h"

namespace ds::optim::simd {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")

struct Avx512 {
  using F = __m512;
  using Mask = __mmask16;
  using D = __m512d;
  static constexpr std::size_t kLanes = 16;

  static Mask full() { return Mask(0xffff); }
  static Mask mask_for(std::size_t left) { return left >= 16 ? Mask(0xffff) : Mask((1u << left) - 1u); }
  static bool is_full(Mask k) { return k == Mask(0xffff); }

  static F set1(float x) { return _mm512_set1_ps(x); }
  static F zero() { return _mm512_setzero_ps(); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  static F zero_masked(Mask k, F x) { return _mm512_maskz_mov_ps(k, x); }

  // a / b without the divider (it limits Adam to ~2 G elements/s per core here, about the
  // memory rate, so the kernel could not overlap it): rcp14 + one Newton step + Markstein's
  // remainder correction, q = q0 + (a - b*q0) * y. The quotient is the correctly rounded one
  // except when the remainder underflows (|a| < ~2^-100): then it is within 1 ulp. Lanes
  // whose quotient is inf/NaN/denormal (b = 0, inf, NaN, denormal; overflow) are redone with
  // the exact division, so special values behave as a / b.
  static F div(F a, F b) {
    F y = _mm512_rcp14_ps(b);
    y = _mm512_fmadd_ps(y, _mm512_fnmadd_ps(b, y, _mm512_set1_ps(1.0f)), y);
    F q = _mm512_mul_ps(a, y);
    q = _mm512_fmadd_ps(_mm512_fnmadd_ps(b, q, a), y, q);
    const __mmask16 bad = _mm512_fpclass_ps_mask(q, 0x01 | 0x08 | 0x10 | 0x20 | 0x80);  // NaN, +-inf, denormal
    if (bad) q = _mm512_mask_div_ps(q, bad, a, b);
    return q;
  }

  static F load(const float* p, Mask k) { return _mm512_maskz_loadu_ps(k, p); }
  static void store(float* p, Mask k, F x) { _mm512_mask_storeu_ps(p, k, x); }

  template <DType G>
  static F load_g(const void* base, std::size_t i, Mask k) {
    if constexpr (G == DType::F32) {
      return _mm512_maskz_loadu_ps(k, static_cast<const float*>(base) + i);
    } else {
      const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const std::uint16_t*>(base) + i);
      if constexpr (G == DType::F16) return _mm512_cvtph_ps(h);
      else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }

  // Working-copy stores. The step writes the working copy and never reads it, so with plain
  // stores every line is first read for ownership: 2 more bytes of traffic per parameter on
  // top of the 28 (Adam) it needs. nt = true writes full vectors with non-temporal stores
  // instead (no read, the line goes to memory); see stream_working() for when the kernels do.
  static void store16(void* base, std::size_t i, __m256i h, Mask k, bool nt) {
    std::uint16_t* a = static_cast<std::uint16_t*>(base) + i;
    if (nt && is_full(k)) _mm256_stream_si256(reinterpret_cast<__m256i*>(a), h);
    else _mm256_mask_storeu_epi16(a, k, h);
  }

  // Round to nearest even, NaN stays (quiet) NaN: identical to ds::float_to_f16 / float_to_bf16.
  template <DType W>
  static void store_w(void* base, std::size_t i, F x, Mask k, bool nt = false) {
    if constexpr (W == DType::F32) {
      float* a = static_cast<float*>(base) + i;
      if (nt && is_full(k)) _mm512_stream_ps(a, x);
      else _mm512_mask_storeu_ps(a, k, x);
    } else if constexpr (W == DType::F16) {
      store16(base, i, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), k, nt);
    } else if constexpr (W == DType::BF16) {
      store16(base, i, f32x16_to_bf16_rne(x), k, nt);
    } else if constexpr (W == kBf16Native) {
      // vcvtneps2bf16 rounds to nearest even and quiets NaN exactly as above, but treats
      // denormal inputs as zero: such vectors take the integer path.
      if (_mm512_fpclass_ps_mask(x, 0x20) != 0) return store_w<DType::BF16>(base, i, x, k, nt);
      store16(base, i, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(x)), k, nt);
    }
  }

  // bf16 by truncation, the cheapest 16-bit write: only the benchmark's memory-limit kernel.
  static void store_bf16_truncated(void* base, std::size_t i, F x, Mask k, bool nt) {
    store16(base, i, _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(x), 16)), k, nt);
  }

  static D zero_d() { return _mm512_setzero_pd(); }
  // Adds the 16 fp32 lanes of x into two double accumulators (8 lanes each).
  static void acc_f32(F x, D& a0, D& a1) {
    a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
    a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
  }
  static double reduce(D a0, D a1) { return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1)); }
  static void sfence() { _mm_sfence(); }
};

#pragma GCC pop_options

}  // namespace ds::optim::simd
#endif  // __x86_64__
