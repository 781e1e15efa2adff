// Plain scalar reference kernel for Adagrad: obviously right.
#include "scalar_math.h"

namespace ds::optim {

void adagrad_ref(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h) {
  detail::check_views(g, w, n, "adagrad");
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = detail::adagrad_elem(detail::load_grad(g, i), sum[i], p[i], h);
    if (w.data) detail::store_working(w, i, p[i]);
  }
}

}  // namespace ds::optim
