// fp32 -> bf16 on 16 AVX-512 lanes, rounded to nearest even by integer arithmetic: the same
// bits as ds::float_to_bf16 (NaN kept quiet), unlike vcvtneps2bf16, which flushes
// denormals. Shared by the bulk converters, the optimizer kernels, the GEMMs' 16-bit epilogue
// and the bf16 GEMM's operand packing; call only after ds::cpu_features() reported AVX-512F/BW.
#pragma once

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

}  // namespace ds
