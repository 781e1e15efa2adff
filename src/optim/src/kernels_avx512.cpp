// The avx512 row of the optimizer kernel table: kernel_bodies.inc over vec_avx512.h.
#include "kernel_set.h"
#include "scalar_math.h"
#include "simd.h"
#include "vec_avx512.h"

namespace ds::optim::simd {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
namespace on_avx512 {
using V = Avx512;
// bf16 working copies through vcvtneps2bf16 where the CPU has AVX512-BF16.
inline bool native_bf16() { return cpu_features().avx512_bf16; }
#include "kernel_bodies.inc"
}  // namespace on_avx512
#pragma GCC pop_options

extern const KernelSet kAvx512Kernels;
const KernelSet kAvx512Kernels = {CpuIsa::avx512,       on_avx512::adam,       on_avx512::sgd,
                                  on_avx512::adagrad,   on_avx512::lamb_pass1, on_avx512::lamb_pass2};

}  // namespace ds::optim::simd
