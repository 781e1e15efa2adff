// Plain scalar reference for Lamb (DeepSpeed FusedLamb math, per segment).
#include <vector>

#include "scalar_math.h"

namespace ds::optim {

void lamb_ref(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n,
              std::span<const Segment> segments, const LambHyper& h, std::span<float> coeffs) {
  detail::check_views(g, w, n, "lamb");
  const Segment whole{0, n};
  if (segments.empty()) segments = std::span<const Segment>(&whole, 1);
  detail::check_segments(segments, n, "lamb");
  DS_CHECK(coeffs.empty() || coeffs.size() == segments.size(),
           "lamb: coeffs holds " << coeffs.size() << " floats for " << segments.size() << " segments");
  for (std::size_t s = 0; s < segments.size(); ++s) {
    const std::size_t lo = segments[s].offset, hi = lo + segments[s].count;
    double p_sq = 0.0, u_sq = 0.0;
    for (std::size_t i = lo; i < hi; ++i) {
      detail::lamb_moments(detail::load_grad(g, i), m[i], v[i], h);
      const float u = detail::lamb_update_dir(m[i], v[i], p[i], h);
      p_sq += double(p[i]) * double(p[i]);
      u_sq += double(u) * double(u);
    }
    const float c = lamb_trust_ratio(p_sq, u_sq, h.min_coeff, h.max_coeff);
    if (!coeffs.empty()) coeffs[s] = c;
    const float sc = h.step_size * c;
    for (std::size_t i = lo; i < hi; ++i) {
      const float u = detail::lamb_update_dir(m[i], v[i], p[i], h);
      p[i] = detail::lamb_apply(p[i], u, sc);
      if (w.data) detail::store_working(w, i, p[i]);
    }
  }
}

}  // namespace ds::optim
