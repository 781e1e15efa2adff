// fp32 -> bf16 on 16 AVX-512 lanes (and 8 AVX2 lanes), rounded to nearest even by integer
// arithmetic: the same bits as ds::float_to_bf16 (NaN kept quiet), unlike vcvtneps2bf16, which
// flushes denormals. Shared by the bulk converters, the optimizer kernels, the GEMMs' 16-bit
// epilogue and the bf16 GEMM's operand packing; call only when ds::cpu_isa() is at least the
// function's ISA. The same on 4 NEON lanes for aarch64 (every aarch64 CPU has them).
#pragma once

#if defined(__x86_64__)
#include <immintrin.h>

namespace ds {

// The rounding step alone, kept in 32-bit lanes: each lane's high 16 bits are its bf16 for a
// finite input (a NaN may come out as an infinity). The bf16 GEMM's packers use it as it is
// (activations and weights are finite; with the NaN fix-up and the narrowing its
// weight-gradient shapes measured 5-10% slower, interleaved runs on the AMD CI machine).
__attribute__((target("avx512f,avx512bw"))) inline __m512i f32x16_to_bf16_rne_hi_finite(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  return _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                                              _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
}

__attribute__((target("avx512f,avx512bw"))) inline __m256i f32x16_to_bf16_rne(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i r = _mm512_mask_mov_epi32(f32x16_to_bf16_rne_hi_finite(x), nan,
                                          _mm512_or_si512(u, _mm512_set1_epi32(0x00400000)));
  return _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
}

// bf16 -> fp32 on 16 lanes (exact).
__attribute__((target("avx512f,avx512bw"))) inline __m512 bf16x16_to_f32(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The same on 8 AVX2 lanes.
__attribute__((target("avx2"))) inline __m128i f32x8_to_bf16_rne(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i rounded = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  // |x| > inf as signed 32-bit (both sides are non-negative): a NaN, kept quiet.
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
  const __m256i r = _mm256_srli_epi32(
      _mm256_blendv_epi8(rounded, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan), 16);
  // packus works within 128-bit halves: [r0..r3 r0..r3 | r4..r7 r4..r7]; gather qwords 0 and 2.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

__attribute__((target("avx2"))) inline __m256 bf16x8_to_f32(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

}  // namespace ds
#endif  // __x86_64__

#if defined(__aarch64__)
#include <arm_neon.h>

namespace ds {

// fp32 -> bf16 on 4 NEON lanes, the same bits as ds::float_to_bf16 (NaN kept quiet).
inline uint16x4_t f32x4_to_bf16_rne(float32x4_t x) {
  const uint32x4_t u = vreinterpretq_u32_f32(x);
  const uint32x4_t rounded = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7fff), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1))));
  const uint32x4_t nan = vcgtq_u32(vandq_u32(u, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
  return vshrn_n_u32(vbslq_u32(nan, vorrq_u32(u, vdupq_n_u32(0x00400000)), rounded), 16);
}

// bf16 -> fp32 on 4 lanes (exact).
inline float32x4_t bf16x4_to_f32(uint16x4_t h) { return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); }

}  // namespace ds
#endif  // __aarch64__
