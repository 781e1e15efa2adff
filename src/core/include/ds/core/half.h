// IEEE fp16 and bfloat16: storage types and round-to-nearest-even conversions.
//
// Scalar conversions are plain, portable code (the reference). The bulk converters take the
// path of the CPU kernel set in use (F16C, AVX2 or AVX-512 lanes; NEON on aarch64) and the
// scalar code for the tail; tests compare every set's path with the scalar code, bitwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ds/core/dtype.h"

namespace ds {

struct f16 { std::uint16_t bits; };
struct bf16 { std::uint16_t bits; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::F16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BF16; };

// --- scalar reference conversions (round to nearest, ties to even; NaN stays NaN) ---

inline float bits_to_float(std::uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline std::uint32_t float_to_bits(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float bf16_to_float(bf16 h) { return bits_to_float(std::uint32_t(h.bits) << 16); }

inline bf16 float_to_bf16(float f) {
  std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{std::uint16_t((u >> 16) | 0x0040u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // ties to even
  return bf16{std::uint16_t(u >> 16)};
}

float f16_to_float(f16 h);
f16 float_to_f16(float f);

// --- bulk conversions (vectorized where the CPU allows) ---
void convert_f32_to_f16(const float* src, f16* dst, std::size_t n);
void convert_f16_to_f32(const f16* src, float* dst, std::size_t n);
void convert_f32_to_bf16(const float* src, bf16* dst, std::size_t n);
void convert_bf16_to_f32(const bf16* src, float* dst, std::size_t n);

// Type-erased conversion between any two of F32 / F16 / BF16 (same type: memcpy).
void convert(const void* src, DType src_type, void* dst, DType dst_type, std::size_t n);

}  // namespace ds
