// Plain scalar reference kernels for Adam/AdamW, SGD and Adagrad: obviously right.
#include "scalar_math.h"

namespace ds::optim {

void adam_ref(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h) {
  detail::check_views(g, w, n, "adam");
  const detail::AdamDerived d = detail::adam_derived(h);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = detail::adam_elem(detail::load_grad(g, i), m[i], v[i], p[i], h, d);
    if (w.data) detail::store_working(w, i, p[i]);
  }
}

void sgd_ref(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h) {
  detail::check_views(g, w, n, "sgd");
  DS_CHECK(buf != nullptr || h.momentum == 0.f, "sgd: momentum " << h.momentum << " needs a momentum buffer");
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = detail::sgd_elem(detail::load_grad(g, i), buf ? buf + i : nullptr, p[i], h);
    if (w.data) detail::store_working(w, i, p[i]);
  }
}

void adagrad_ref(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h) {
  detail::check_views(g, w, n, "adagrad");
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = detail::adagrad_elem(detail::load_grad(g, i), sum[i], p[i], h);
    if (w.data) detail::store_working(w, i, p[i]);
  }
}

}  // namespace ds::optim
