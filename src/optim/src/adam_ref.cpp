// Plain scalar reference kernel for Adam/AdamW: obviously right.
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

}  // namespace ds::optim
