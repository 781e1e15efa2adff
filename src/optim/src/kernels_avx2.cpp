// The avx2 row of the optimizer kernel table: kernel_bodies.inc over vec_avx2.h.
#include "kernel_set.h"
#include "scalar_math.h"
#include "simd.h"
#include "vec_avx2.h"

namespace ds::optim::simd {

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace on_avx2 {
using V = Avx2;
inline bool native_bf16() { return false; }
#include "kernel_bodies.inc"
}  // namespace on_avx2
#pragma GCC pop_options

extern const KernelSet kAvx2Kernels;
const KernelSet kAvx2Kernels = {CpuIsa::avx2,       on_avx2::adam,       on_avx2::sgd,
                                on_avx2::adagrad,   on_avx2::lamb_pass1, on_avx2::lamb_pass2};

}  // namespace ds::optim::simd
