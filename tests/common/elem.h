// Element access to a fp32 / fp16 / bf16 TensorView as float, for the small test Modules
// (fp32 math on any working dtype). Slow on purpose: one element at a time, no SIMD.
#pragma once

#include <cstddef>

#include "ds/core/half.h"
#include "ds/core/buffer.h"

namespace ds::test {

inline float load(const TensorView& v, std::size_t i) {
  switch (v.dtype) {
    case DType::F16: return f16_to_float(v.as<f16>()[i]);
    case DType::BF16: return bf16_to_float(v.as<bf16>()[i]);
    default: return v.as<float>()[i];
  }
}

inline void store(const TensorView& v, std::size_t i, float x) {
  switch (v.dtype) {
    case DType::F16: v.as<f16>()[i] = float_to_f16(x); break;
    case DType::BF16: v.as<bf16>()[i] = float_to_bf16(x); break;
    default: v.as<float>()[i] = x;
  }
}

}  // namespace ds::test
