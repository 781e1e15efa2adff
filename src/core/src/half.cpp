// fp16 / bf16 conversions: scalar reference plus bulk paths for the CPU kernel set in use
// (ds::cpu_isa(): F16C from avx2 up; bf16 on 8 AVX2 or 16 AVX-512 lanes; on neon fcvt for fp16
// and bf16 by the same integer rounding, 8 elements per step).
#include "ds/core/half.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ds/core/bf16_simd.h"
#include "ds/core/cpu_features.h"
#include "ds/core/error.h"

namespace ds {

float f16_to_float(f16 h) {
  const std::uint32_t sign = std::uint32_t(h.bits & 0x8000u) << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf / NaN
  if (exp == 0) {
    if (man == 0) return bits_to_float(sign);
    // subnormal: value = man * 2^-24
    float v = float(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  return bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

f16 float_to_f16(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{std::uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu))};  // NaN
  if (a >= 0x477ff000u) return f16{std::uint16_t(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (a < 0x38800000u) {  // below the smallest normal (2^-14): subnormal or zero
    // Scale into units of 2^-24 with float arithmetic, which rounds to nearest even.
    const float v = bits_to_float(a) * 16777216.0f;  // exact: power-of-two scaling
    const float r = __builtin_nearbyintf(v);         // ties-to-even under the default mode
    return f16{std::uint16_t(sign | std::uint16_t(r))};
  }
  std::uint32_t m = a + 0xfffu + ((a >> 13) & 1u);  // round to nearest even at bit 13
  m -= 0x38000000u;                                // rebias exponent 127 -> 15
  return f16{std::uint16_t(sign | (m >> 13))};
}

namespace {

#if defined(__x86_64__)
// --- F16C (8 lanes) ---
__attribute__((target("f16c,avx"))) void f32_to_f16_f16c(const float* s, f16* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
}
__attribute__((target("f16c,avx"))) void f16_to_f32_f16c(const f16* s, float* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(h));
  }
}

// --- AVX-512 bf16 (16 lanes) by integer rounding, identical to the scalar code ---
__attribute__((target("avx512f,avx512bw"))) void f32_to_bf16_avx512(const float* s, bf16* d, std::size_t n, std::size_t& i) {
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), f32x16_to_bf16_rne(_mm512_loadu_ps(s + i)));
}
__attribute__((target("avx512f,avx512bw"))) void bf16_to_f32_avx512(const bf16* s, float* d, std::size_t n, std::size_t& i) {
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, bf16x16_to_f32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i))));
}

// --- AVX2 bf16 (8 lanes), identical to the scalar code ---
__attribute__((target("avx2"))) void f32_to_bf16_avx2(const float* s, bf16* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), f32x8_to_bf16_rne(_mm256_loadu_ps(s + i)));
}
__attribute__((target("avx2"))) void bf16_to_f32_avx2(const bf16* s, float* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, bf16x8_to_f32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
}
#endif  // __x86_64__

#if defined(__aarch64__)
// --- NEON: fp16 by fcvtn / fcvtl (round to nearest even, subnormals kept under Linux's FPCR),
// bf16 by integer rounding; both the scalar code's bits ---
void f32_to_f16_neon(const float* s, f16* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8) {
    const float16x8_t h = vcombine_f16(vcvt_f16_f32(vld1q_f32(s + i)), vcvt_f16_f32(vld1q_f32(s + i + 4)));
    vst1q_u16(&d[i].bits, vreinterpretq_u16_f16(h));
  }
}
void f16_to_f32_neon(const f16* s, float* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8) {
    const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(&s[i].bits));
    vst1q_f32(d + i, vcvt_f32_f16(vget_low_f16(h)));
    vst1q_f32(d + i + 4, vcvt_high_f32_f16(h));
  }
}
void f32_to_bf16_neon(const float* s, bf16* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8)
    vst1q_u16(&d[i].bits, vcombine_u16(f32x4_to_bf16_rne(vld1q_f32(s + i)), f32x4_to_bf16_rne(vld1q_f32(s + i + 4))));
}
void bf16_to_f32_neon(const bf16* s, float* d, std::size_t n, std::size_t& i) {
  for (; i + 8 <= n; i += 8) {
    const uint16x8_t h = vld1q_u16(&s[i].bits);
    vst1q_f32(d + i, bf16x4_to_f32(vget_low_u16(h)));
    vst1q_f32(d + i + 4, bf16x4_to_f32(vget_high_u16(h)));
  }
}
#endif  // __aarch64__

}  // namespace

void convert_f32_to_f16(const float* src, f16* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__x86_64__)
  if (isa_at_least(CpuIsa::avx2)) f32_to_f16_f16c(src, dst, n, i);
#elif defined(__aarch64__)
  if (isa_at_least(CpuIsa::neon)) f32_to_f16_neon(src, dst, n, i);
#endif
  for (; i < n; ++i) dst[i] = float_to_f16(src[i]);
}
void convert_f16_to_f32(const f16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__x86_64__)
  if (isa_at_least(CpuIsa::avx2)) f16_to_f32_f16c(src, dst, n, i);
#elif defined(__aarch64__)
  if (isa_at_least(CpuIsa::neon)) f16_to_f32_neon(src, dst, n, i);
#endif
  for (; i < n; ++i) dst[i] = f16_to_float(src[i]);
}
void convert_f32_to_bf16(const float* src, bf16* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__x86_64__)
  if (isa_at_least(CpuIsa::avx512)) f32_to_bf16_avx512(src, dst, n, i);
  else if (isa_at_least(CpuIsa::avx2)) f32_to_bf16_avx2(src, dst, n, i);
#elif defined(__aarch64__)
  if (isa_at_least(CpuIsa::neon)) f32_to_bf16_neon(src, dst, n, i);
#endif
  for (; i < n; ++i) dst[i] = float_to_bf16(src[i]);
}
void convert_bf16_to_f32(const bf16* src, float* dst, std::size_t n) {
  std::size_t i = 0;
#if defined(__x86_64__)
  if (isa_at_least(CpuIsa::avx512)) bf16_to_f32_avx512(src, dst, n, i);
  else if (isa_at_least(CpuIsa::avx2)) bf16_to_f32_avx2(src, dst, n, i);
#elif defined(__aarch64__)
  if (isa_at_least(CpuIsa::neon)) bf16_to_f32_neon(src, dst, n, i);
#endif
  for (; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void convert(const void* src, DType st, void* dst, DType dt, std::size_t n) {
  if (st == dt) { std::memcpy(dst, src, n * dtype_size(st)); return; }
  if (st == DType::F32 && dt == DType::F16) return convert_f32_to_f16(static_cast<const float*>(src), static_cast<f16*>(dst), n);
  if (st == DType::F32 && dt == DType::BF16) return convert_f32_to_bf16(static_cast<const float*>(src), static_cast<bf16*>(dst), n);
  if (st == DType::F16 && dt == DType::F32) return convert_f16_to_f32(static_cast<const f16*>(src), static_cast<float*>(dst), n);
  if (st == DType::BF16 && dt == DType::F32) return convert_bf16_to_f32(static_cast<const bf16*>(src), static_cast<float*>(dst), n);
  DS_THROW("no conversion from " << dtype_name(st) << " to " << dtype_name(dt));
}

}  // namespace ds
