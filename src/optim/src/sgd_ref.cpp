// Plain scalar reference kernel for SGD (momentum, dampening, nesterov, weight decay;
// torch semantics): obviously right.
#include "scalar_math.h"

namespace ds::optim {

void sgd_ref(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h) {
  detail::check_views(g, w, n, "sgd");
  DS_CHECK(buf != nullptr || h.momentum == 0.f, "sgd: momentum " << h.momentum << " needs a momentum buffer");
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = detail::sgd_elem(detail::load_grad(g, i), buf ? buf + i : nullptr, p[i], h);
    if (w.data) detail::store_working(w, i, p[i]);
  }
}

}  // namespace ds::optim
