// The table of the fast CPU optimizer kernels: one row per vector ISA (kernels_<isa>.cpp, each
// the bodies of kernel_bodies.inc compiled for that ISA). The *_cpu entry points take the row
// for ds::cpu_isa() and fall back to their portable loops (bitwise equal to the references)
// where there is none. Adding an ISA: a vec_<isa>.h row of the vector interface, a
// kernels_<isa>.cpp, and its line in kernel_set.cpp. Private header.
#pragma once

#include <cstddef>

#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/optim/kernels.h"
#include "elem_math.h"

namespace ds::optim::simd {

struct KernelSet {
  CpuIsa isa;
  // Whole steps over [0, n): threads, dtypes and streaming stores chosen inside.
  void (*adam)(float* p, float* m, float* v, const TensorView& g, const TensorView& w, std::size_t n,
               const AdamHyper& h, const detail::AdamDerived& d);
  void (*sgd)(float* p, float* buf, const TensorView& g, const TensorView& w, std::size_t n, const SgdHyper& h);
  void (*adagrad)(float* p, float* sum, const TensorView& g, const TensorView& w, std::size_t n,
                  const AdagradHyper& h);
  // Lamb's two passes over one chunk [lo, hi) on the calling thread (lamb_cpu splits the work):
  // pass 1 updates the moments and returns the chunk's ||p||^2 and ||u||^2; pass 2 applies the
  // scaled update and writes the working copy (nt: with streaming stores).
  void (*lamb_pass1)(float* p, float* m, float* v, const TensorView& g, std::size_t lo, std::size_t hi,
                     const LambHyper& h, double* p_sq, double* u_sq);
  void (*lamb_pass2)(float* p, const float* m, const float* v, const TensorView& w, std::size_t lo, std::size_t hi,
                     const LambHyper& h, float sc, bool nt);
};

// The row for the ISA in use (ds::cpu_isa(), read per call); nullptr: the portable loops.
const KernelSet* cpu_kernels();

}  // namespace ds::optim::simd
