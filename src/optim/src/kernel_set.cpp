// The rows of the optimizer kernel table, best first (kernel_set.h).
#include "kernel_set.h"

namespace ds::optim::simd {

#if defined(__x86_64__)
extern const KernelSet kAvx512Kernels;
extern const KernelSet kAvx2Kernels;
namespace {
const KernelSet* const kRows[] = {&kAvx512Kernels, &kAvx2Kernels};
}  // namespace
#elif defined(__aarch64__)
extern const KernelSet kNeonKernels;
namespace {
const KernelSet* const kRows[] = {&kNeonKernels};
}  // namespace
#else
namespace {
const KernelSet* const kRows[] = {nullptr};
}  // namespace
#endif

// The row of exactly the ISA in use: a forced lower ISA must run its own kernels.
const KernelSet* cpu_kernels() {
  const CpuIsa isa = cpu_isa();
  for (const KernelSet* row : kRows)
    if (row != nullptr && row->isa == isa) return row;
  return nullptr;
}

}  // namespace ds::optim::simd
