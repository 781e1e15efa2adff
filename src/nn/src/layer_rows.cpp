// The rows of the layer row-kernel table (layer_rows.h): layer_rows.inc compiled once per
// CPU kernel set. avx512 and avx2 are the x86-64-v4 and -v3 levels (what the target_clones
// copies were built for); the base copy is the library's own target (x86-64 baseline, or
// aarch64 with its mandatory Advanced SIMD).
#include "layer_rows.h"

#include <cmath>
#include <cstdint>

#include "layer_math.h"

namespace ds::nn::kernels {

#if defined(__x86_64__)
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
namespace on_avx512 {
constexpr CpuIsa kIsa = CpuIsa::avx512;
#include "layer_rows.inc"
}  // namespace on_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
namespace on_avx2 {
constexpr CpuIsa kIsa = CpuIsa::avx2;
#include "layer_rows.inc"
}  // namespace on_avx2
#pragma GCC pop_options
#endif

namespace on_base {
#if defined(__aarch64__)
constexpr CpuIsa kIsa = CpuIsa::neon;
#else
constexpr CpuIsa kIsa = CpuIsa::plain;
#endif
#include "layer_rows.inc"
}  // namespace on_base

#if defined(__aarch64__)
// The baseline is NEON there: DS_CPU_ISA=plain runs the same copy, labelled as asked.
const LayerRows kPlainRows = [] {
  LayerRows r = on_base::kRows;
  r.isa = CpuIsa::plain;
  return r;
}();
#endif

const LayerRows& layer_rows() {
  switch (cpu_isa()) {
#if defined(__x86_64__)
    case CpuIsa::avx512: return on_avx512::kRows;
    case CpuIsa::avx2: return on_avx2::kRows;
#endif
#if defined(__aarch64__)
    case CpuIsa::plain: return kPlainRows;
#endif
    default: return on_base::kRows;
  }
}

}  // namespace ds::nn::kernels
