// The NEON row of the optimizer kernels' vector interface (aarch64 Advanced SIMD, 4 fp32
// lanes). The interface is vec_avx512.h's. A lane mask is a vector of all-ones / zero lanes
// plus their count; NEON has no masked loads or stores, so tails go through a small zeroed
// stack copy. fmadd is vfmaq_f32 (one rounding, as the references' fmaf), division the exact
// vdivq_f32, fp16 through the FCVT conversions (round to nearest even, NaN kept quiet: as
// ds::float_to_f16), bf16 by integer rounding (ds/core/bf16_simd.h). AArch64 has no
// non-temporal vector store intrinsic: nt stores are plain stores. Private header; NEON is
// part of every aarch64 CPU (kernels_neon.cpp, built on aarch64 only).
#pragma once

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ds/core/bf16_simd.h"
#include "simd.h"

namespace ds::optim::simd {

struct Neon {
  using F = float32x4_t;
  struct Mask {
    uint32x4_t lanes;
    unsigned count;
  };
  using D = float64x2_t;
  static constexpr std::size_t kLanes = 4;

  static Mask full() { return {vdupq_n_u32(0xffffffffu), 4}; }
  static Mask mask_for(std::size_t left) {
    if (left >= 4) return full();
    static constexpr std::uint32_t kIota[4] = {0, 1, 2, 3};
    return {vcltq_u32(vld1q_u32(kIota), vdupq_n_u32(std::uint32_t(left))), unsigned(left)};
  }
  static bool is_full(const Mask& k) { return k.count == 4; }

  static F set1(float x) { return vdupq_n_f32(x); }
  static F zero() { return vdupq_n_f32(0.0f); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F fmadd(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F sqrt(F a) { return vsqrtq_f32(a); }
  static F div(F a, F b) { return vdivq_f32(a, b); }
  static F zero_masked(const Mask& k, F x) { return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(x), k.lanes)); }

  static F load(const float* p, const Mask& k) {
    if (is_full(k)) return vld1q_f32(p);
    float tmp[4] = {};
    std::memcpy(tmp, p, k.count * sizeof(float));
    return vld1q_f32(tmp);
  }
  static void store(float* p, const Mask& k, F x) {
    if (is_full(k)) return vst1q_f32(p, x);
    float tmp[4];
    vst1q_f32(tmp, x);
    std::memcpy(p, tmp, k.count * sizeof(float));
  }

  // 4 16-bit values; a tail is copied through a zeroed stack vector.
  static uint16x4_t load16(const void* base, std::size_t i, const Mask& k) {
    const std::uint16_t* a = static_cast<const std::uint16_t*>(base) + i;
    if (is_full(k)) return vld1_u16(a);
    std::uint16_t tmp[4] = {};
    std::memcpy(tmp, a, k.count * sizeof(std::uint16_t));
    return vld1_u16(tmp);
  }
  static void store16(void* base, std::size_t i, uint16x4_t h, const Mask& k) {
    std::uint16_t* a = static_cast<std::uint16_t*>(base) + i;
    if (is_full(k)) return vst1_u16(a, h);
    std::uint16_t tmp[4];
    vst1_u16(tmp, h);
    std::memcpy(a, tmp, k.count * sizeof(std::uint16_t));
  }

  template <DType G>
  static F load_g(const void* base, std::size_t i, const Mask& k) {
    if constexpr (G == DType::F32) return load(static_cast<const float*>(base) + i, k);
    else if constexpr (G == DType::F16) return vcvt_f32_f16(vreinterpret_f16_u16(load16(base, i, k)));
    else return bf16x4_to_f32(load16(base, i, k));
  }

  // Round to nearest even, NaN stays (quiet) NaN: identical to ds::float_to_f16 / float_to_bf16.
  // (kBf16Native never reaches this row: simd::dispatch maps it to BF16 without native bf16.)
  template <DType W>
  static void store_w(void* base, std::size_t i, F x, const Mask& k, bool /*nt*/ = false) {
    if constexpr (W == DType::F32) store(static_cast<float*>(base) + i, k, x);
    else if constexpr (W == DType::F16) store16(base, i, vreinterpret_u16_f16(vcvt_f16_f32(x)), k);
    else if constexpr (W == DType::BF16 || W == kBf16Native) store16(base, i, f32x4_to_bf16_rne(x), k);
  }

  // bf16 by truncation, the cheapest 16-bit write: only the benchmark's memory-limit kernel.
  static void store_bf16_truncated(void* base, std::size_t i, F x, const Mask& k, bool /*nt*/) {
    store16(base, i, vshrn_n_u32(vreinterpretq_u32_f32(x), 16), k);
  }

  static D zero_d() { return vdupq_n_f64(0.0); }
  // Adds the 4 fp32 lanes of x into two double accumulators (2 lanes each).
  static void acc_f32(F x, D& a0, D& a1) {
    a0 = vaddq_f64(a0, vcvt_f64_f32(vget_low_f32(x)));
    a1 = vaddq_f64(a1, vcvt_high_f64_f32(x));
  }
  static double reduce(D a0, D a1) { return vaddvq_f64(vaddq_f64(a0, a1)); }
  static void sfence() {}
};

}  // namespace ds::optim::simd
#endif  // __aarch64__
