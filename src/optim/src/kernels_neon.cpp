// The neon row of the optimizer kernel table: kernel_bodies.inc over vec_neon.h (aarch64 only;
// Advanced SIMD is the architecture's baseline, so no target pragma).
#include "kernel_set.h"
#include "scalar_math.h"
#include "simd.h"
#include "vec_neon.h"

namespace ds::optim::simd {

namespace on_neon {
using V = Neon;
inline bool native_bf16() { return false; }
#include "kernel_bodies.inc"
}  // namespace on_neon

extern const KernelSet kNeonKernels;
const KernelSet kNeonKernels = {CpuIsa::neon,       on_neon::adam,       on_neon::sgd,
                                on_neon::adagrad,   on_neon::lamb_pass1, on_neon::lamb_pass2};

}  // namespace ds::optim::simd
