// Element types that parameters, gradients and messages can have.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ds {

enum class DType : std::uint8_t { F32, F16, BF16, F64, I32, I64, U8 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

// "fp32", "fp16", "bf16", "fp64", "int32", "int64", "uint8"
std::string_view dtype_name(DType t);
// Accepts DeepSpeed's spellings, case-insensitive: fp32/float32/float, fp16/float16/half,
// bf16/bfloat16, fp64/float64/double, int32, int64, uint8. Throws ds::Error otherwise.
DType parse_dtype(std::string_view name);

template <typename T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::F32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::F64; };
template <> struct dtype_of<std::int32_t> { static constexpr DType value = DType::I32; };
template <> struct dtype_of<std::int64_t> { static constexpr DType value = DType::I64; };
template <> struct dtype_of<std::uint8_t> { static constexpr DType value = DType::U8; };

}  // namespace ds
