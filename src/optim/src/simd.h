// Private helpers of the fast CPU kernels: AVX-512 loads/stores of fp32/fp16/bf16 with
// masked tails, the (grad dtype, working dtype) dispatch, and the OpenMP range split.
// Everything between the GCC target pragmas is compiled for AVX-512 and only ever called
// after ds::cpu_features() said the CPU has it.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "ds/core/bf16_simd.h"
#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/core/env.h"
#include "ds/core/error.h"

namespace ds::optim::simd {

// Working-copy kinds in the dispatch: the DTypes, plus two internal sentinels.
inline constexpr DType kNone = DType::U8;          // no working copy
inline constexpr DType kBf16Native = DType::I64;  // bf16 through AVX512_BF16's vcvtneps2bf16

// AVX-512 kernels unless the CPU lacks them or DS_CPU_SIMD=0 (then the plain loops, which
// round exactly like the references: the tests use it to cover that path; read per call).
inline bool have_avx512() {
  const CpuFeatures& f = cpu_features();
  if (!env::get_bool("DS_CPU_SIMD")) return false;
  return f.avx512f && f.avx512bw && f.avx512vl && f.f16c;
}

// Calls f.template operator()<G, W>() for the runtime dtypes (w = kNone: no working copy).
template <class F>
void dispatch(DType g, DType w, F&& f) {
  auto with_w = [&]<DType G>() {
    switch (w) {
      case DType::F32: f.template operator()<G, DType::F32>(); break;
      case DType::F16: f.template operator()<G, DType::F16>(); break;
      case DType::BF16:
        if (cpu_features().avx512_bf16) f.template operator()<G, kBf16Native>();
        else f.template operator()<G, DType::BF16>();
        break;
      default: f.template operator()<G, kNone>(); break;
    }
  };
  switch (g) {
    case DType::F16: with_w.template operator()<DType::F16>(); break;
    case DType::BF16: with_w.template operator()<DType::BF16>(); break;
    default: with_w.template operator()<DType::F32>(); break;
  }
}

// Below this many elements one thread does it all (a parallel region costs a few us).
inline constexpr std::size_t kMinParallel = 1 << 15;

// Non-temporal working-copy stores (store_w's nt) from this many bytes of working copy up
// (twice a core's L2 here): the step streams 7-10x as many bytes of state through the caches
// in the same pass, so a copy this large would not stay cached for the next forward pass
// anyway, and the stores skip the read-for-ownership of every line (bench/optim: faster from
// 10M parameters on). Below it, plain stores leave the copy in cache.
inline constexpr std::size_t kStreamWorkingBytes = std::size_t(4) << 20;

// The threshold stream_working() uses: kStreamWorkingBytes. Not a user setting; the kernel
// tests (which include this private header) lower it to 0 to cover the streaming stores at
// small, awkward sizes, and put it back.
inline std::size_t& stream_min_bytes() {
  static std::size_t bytes = kStreamWorkingBytes;
  return bytes;
}

// Whether a step over n elements writes working copy w (dtype wt; null: none) with
// non-temporal stores: large enough, and aligned for them (64 bytes; the kernels' vectors
// start at 16-element multiples, so every full fp32 vector is then 64-byte and every 16-bit
// one 32-byte aligned).
inline bool stream_working(const void* w, std::size_t n, DType wt) {
  if (w == nullptr || (reinterpret_cast<std::uintptr_t>(w) % 64) != 0) return false;
  return n * dtype_size(wt) >= stream_min_bytes();
}

// Splits [0, n) into one contiguous range per thread, boundaries on 16-element (64-byte)
// multiples, and calls chunk(lo, hi) on each.
template <class Chunk>
void parallel_ranges(std::size_t n, Chunk&& chunk) {
  const int nt = n < kMinParallel ? 1 : omp_get_max_threads();
  if (nt <= 1) {
    if (n) chunk(std::size_t(0), n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const std::size_t t = std::size_t(omp_get_thread_num()), T = std::size_t(omp_get_num_threads());
    const std::size_t per = ((n + T - 1) / T + 15) & ~std::size_t(15);
    const std::size_t lo = std::min(n, t * per), hi = std::min(n, lo + per);
    if (lo < hi) chunk(lo, hi);
  }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")

inline __mmask16 mask_for(std::size_t left) {
  return left >= 16 ? __mmask16(0xffff) : __mmask16((1u << left) - 1u);
}

// Software prefetch distance, in bytes ahead of the element being processed, per stream.
// The hardware prefetchers alone let the compute-heavier kernels (a square root and a
// division per element) fall 5-15% behind a plain streaming kernel with the same bytes,
// most at 2 threads; a prefetch per 64-byte line this far ahead closes most of that gap
// (bench/optim: the pattern kernel uses the same loop, so the limit gains it too).
inline constexpr std::size_t kPrefetchBytes = 1024;

// Prefetches, kPrefetchBytes ahead, the lines that elements [i, i + 32) of a stream of
// element size E bytes will need: 2 lines for fp32, 1 for fp16/bf16.
template <std::size_t E>
inline void prefetch32(const void* base, std::size_t i) {
  const char* a = static_cast<const char*>(base) + i * E + kPrefetchBytes;
  _mm_prefetch(a, _MM_HINT_T0);
  if constexpr (E == 4) _mm_prefetch(a + 64, _MM_HINT_T0);
}

// The gradient stream (dtype G) and the working-copy stream (W, kNone: nothing).
template <DType G>
inline void prefetch_g32(const void* g, std::size_t i) {
  prefetch32<G == DType::F32 ? 4 : 2>(g, i);
}
// Not with non-temporal stores (nt): a prefetch would read the line those stores avoid reading.
template <DType W>
inline void prefetch_w32(const void* w, std::size_t i, bool nt) {
  if (nt) return;
  if constexpr (W == DType::F32) prefetch32<4>(w, i);
  else if constexpr (W != kNone) prefetch32<2>(w, i);
}

// The loop of every streaming kernel: body(i, k) on the 16-element vectors of [lo, hi), k the
// lane mask. Full vectors go two at a time with k all-ones (the masked loads/stores fold into
// plain ones), after prefetch(i) has prefetched each stream's lines for [i, i + 32); the
// remaining 0-31 elements run masked. body must not depend on the grouping (element math
// only), so results are identical to a one-vector masked loop.
template <class Prefetch, class Body>
__attribute__((always_inline)) inline void stream_loop(std::size_t lo, std::size_t hi, Prefetch&& prefetch,
                                                       Body&& body) {
  std::size_t i = lo;
  for (; i + 32 <= hi; i += 32) {
    prefetch(i);
    body(i, __mmask16(0xffff));
    body(i + 16, __mmask16(0xffff));
  }
  for (; i < hi; i += 16) body(i, mask_for(hi - i));
}

template <DType G>
inline __m512 load_g(const void* base, std::size_t i, __mmask16 k) {
  if constexpr (G == DType::F32) {
    return _mm512_maskz_loadu_ps(k, static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(k, static_cast<const std::uint16_t*>(base) + i);
    if constexpr (G == DType::F16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Working-copy stores. The step writes the working copy and never reads it, so with plain
// stores every line is first read for ownership: 2 more bytes of traffic per parameter on top
// of the 28 (Adam) it needs. nt = true writes full vectors with non-temporal stores instead
// (no read, the line goes to memory); see stream_working() for when the kernels do.
inline void store16(void* base, std::size_t i, __m256i h, __mmask16 k, bool nt) {
  std::uint16_t* a = static_cast<std::uint16_t*>(base) + i;
  if (nt && k == __mmask16(0xffff)) _mm256_stream_si256(reinterpret_cast<__m256i*>(a), h);
  else _mm256_mask_storeu_epi16(a, k, h);
}

// Round to nearest even, NaN stays (quiet) NaN: identical to ds::float_to_f16 / float_to_bf16.
template <DType W>
inline void store_w(void* base, std::size_t i, __m512 x, __mmask16 k, bool nt = false) {
  if constexpr (W == DType::F32) {
    float* a = static_cast<float*>(base) + i;
    if (nt && k == __mmask16(0xffff)) _mm512_stream_ps(a, x);
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

// a / b without the divider (it limits Adam to ~2 G elements/s per core here, about the
// memory rate, so the kernel could not overlap it): rcp14 + one Newton step + Markstein's
// remainder correction, q = q0 + (a - b*q0) * y. The quotient is the correctly rounded one
// except when the remainder underflows (|a| < ~2^-100): then it is within 1 ulp. Lanes
// whose quotient is inf/NaN/denormal (b = 0, inf, NaN, denormal; overflow) are redone with
// the exact division, so special values behave as a / b.
inline __m512 fast_div(__m512 a, __m512 b) {
  __m512 y = _mm512_rcp14_ps(b);
  y = _mm512_fmadd_ps(y, _mm512_fnmadd_ps(b, y, _mm512_set1_ps(1.0f)), y);
  __m512 q = _mm512_mul_ps(a, y);
  q = _mm512_fmadd_ps(_mm512_fnmadd_ps(b, q, a), y, q);
  const __mmask16 bad = _mm512_fpclass_ps_mask(q, 0x01 | 0x08 | 0x10 | 0x20 | 0x80);  // NaN, +-inf, denormal
  if (bad) q = _mm512_mask_div_ps(q, bad, a, b);
  return q;
}

// Adds the 16 fp32 lanes of x into two double accumulators (8 lanes each).
inline void acc_f32(__m512 x, __m512d& a0, __m512d& a1) {
  a0 = _mm512_add_pd(a0, _mm512_cvtps_pd(_mm512_castps512_ps256(x)));
  a1 = _mm512_add_pd(a1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))));
}

// Horizontal sum of squares of x's 16 lanes into two double accumulators (masked lanes are 0).
inline void acc_sq(__m512 x, __m512d& a0, __m512d& a1) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  a0 = _mm512_fmadd_pd(lo, lo, a0);
  a1 = _mm512_fmadd_pd(hi, hi, a1);
}

#pragma GCC pop_options

}  // namespace ds::optim::simd
