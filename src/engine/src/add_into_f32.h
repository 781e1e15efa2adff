// acc[j] += float(src[j]) over a F32 / F16 / BF16 view: the fp32 folds of the engine
// (data_types.grad_accum_dtype fp32 after each backward; stage 3's reduced gradient pieces).
#pragma once

#include <cstdint>

#include "ds/core/buffer.h"
#include "ds/core/error.h"
#include "ds/core/half.h"

namespace ds::engine {

inline void add_into_f32(float* acc, TensorView src) {
  const std::int64_t n = std::int64_t(src.count);
  switch (src.dtype) {
    case DType::F32: {
      const float* p = src.as<float>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (std::int64_t j = 0; j < n; ++j) acc[j] += p[j];
      return;
    }
    case DType::BF16: {
      const bf16* p = src.as<bf16>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (std::int64_t j = 0; j < n; ++j) acc[j] += bf16_to_float(p[j]);
      return;
    }
    case DType::F16: {
      const f16* p = src.as<f16>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
      for (std::int64_t j = 0; j < n; ++j) acc[j] += f16_to_float(p[j]);
      return;
    }
    default:
      DS_THROW("adding " << dtype_name(src.dtype) << " gradients into fp32: unsupported dtype");
  }
}

}  // namespace ds::engine
