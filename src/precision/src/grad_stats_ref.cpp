// Plain scalar reference for grad_stats (obviously right; the tests' yardstick).
#include <cmath>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/precision/grad_stats.h"

namespace ds::precision {

GradStats grad_stats_ref(TensorView g, double multiplier) {
  double sum = 0.0;
  bool bad = false;
  for (std::size_t i = 0; i < g.count; ++i) {
    float v;
    switch (g.dtype) {
      case DType::F32: v = g.as<const float>()[i]; break;
      case DType::F16: v = f16_to_float(g.as<const f16>()[i]); break;
      case DType::BF16: v = bf16_to_float(g.as<const bf16>()[i]); break;
      default: DS_THROW("grad_stats: gradient dtype must be fp32, fp16 or bf16, got " << dtype_name(g.dtype));
    }
    if (!std::isfinite(v)) bad = true;
    sum += double(v) * double(v);
  }
  if (g.count == 0 && g.dtype != DType::F32 && g.dtype != DType::F16 && g.dtype != DType::BF16)
    DS_THROW("grad_stats: gradient dtype must be fp32, fp16 or bf16, got " << dtype_name(g.dtype));
  return {sum * multiplier * multiplier, bad};
}

}  // namespace ds::precision
