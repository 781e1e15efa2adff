// Fast SGD (momentum, dampening, nesterov, weight decay; torch semantics): one pass, the
// vector row of the ISA in use (kernel_set.h), else the portable loop (bitwise sgd_ref).
#include "kernel_set.h"
#include "scalar_math.h"
#include "simd.h"

namespace ds::optim {

void sgd_cpu(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h) {
  detail::check_views(g, w, n, "sgd");
  DS_CHECK(buf != nullptr || h.momentum == 0.f, "sgd: momentum " << h.momentum << " needs a momentum buffer");
  if (const simd::KernelSet* ks = simd::cpu_kernels()) return ks->sgd(p, buf, g, w, n, h);
  simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      p[i] = detail::sgd_elem(detail::load_grad(g, i), buf ? buf + i : nullptr, p[i], h);
      if (w.data) detail::store_working(w, i, p[i]);
    }
  });
}

}  // namespace ds::optim
