// Fast Adam/AdamW: one pass, fp16/bf16 gradient read and working write fused; the vector row
// of the ISA in use (kernel_set.h), else the portable loop (bitwise adam_ref).
#include "kernel_set.h"
#include "scalar_math.h"
#include "simd.h"

namespace ds::optim {

void adam_cpu(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h) {
  detail::check_views(g, w, n, "adam");
  const detail::AdamDerived d = detail::adam_derived(h);
  if (const simd::KernelSet* ks = simd::cpu_kernels()) return ks->adam(p, m, v, g, w, n, h, d);
  simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      p[i] = detail::adam_elem(detail::load_grad(g, i), m[i], v[i], p[i], h, d);
      if (w.data) detail::store_working(w, i, p[i]);
    }
  });
}

}  // namespace ds::optim
