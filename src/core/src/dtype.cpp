#include "ds/core/dtype.h"

#include <algorithm>
#include <cctype>

#include "ds/core/error.h"

namespace ds {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::F64: return "fp64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  std::string s(name);
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "fp32" || s == "float32" || s == "float" || s == "f32") return DType::F32;
  if (s == "fp16" || s == "float16" || s == "half" || s == "f16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp64" || s == "float64" || s == "double") return DType::F64;
  if (s == "int32") return DType::I32;
  if (s == "int64") return DType::I64;
  if (s == "uint8") return DType::U8;
  DS_THROW("unknown data type '" << name << "' (expected fp32, fp16 or bf16)");
}

}  // namespace ds
