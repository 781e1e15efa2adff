// Fast Adagrad: one pass, the vector row of the ISA in use (kernel_set.h), else the portable
// loop (bitwise adagrad_ref).
#include "kernel_set.h"
#include "scalar_math.h"
#include "simd.h"

namespace ds::optim {

void adagrad_cpu(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h) {
  detail::check_views(g, w, n, "adagrad");
  if (const simd::KernelSet* ks = simd::cpu_kernels()) return ks->adagrad(p, sum, g, w, n, h);
  simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      p[i] = detail::adagrad_elem(detail::load_grad(g, i), sum[i], p[i], h);
      if (w.data) detail::store_working(w, i, p[i]);
    }
  });
}

}  // namespace ds::optim
