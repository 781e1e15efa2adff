// Fast Lamb: pass 1 updates the moments and sums ||p||^2, ||u||^2 per segment; pass 2
// recomputes u from the stored moments (cheaper than storing it) and applies the trust
// ratio. Work is split into chunks that never cross a segment; chunk sums are combined in
// order, so the result does not depend on the thread count. Element math is that of lamb_ref
// (division: the row's V::div); the vector rows' norms differ in summation order (fp32 partial
// sums of 16 squares per lane, then double): ~1e-7 relative on the trust ratio.
#include <vector>

#include "kernel_set.h"
#include "scalar_math.h"
#include "simd.h"

namespace ds::optim {
namespace {

constexpr std::size_t kChunk = 1 << 15;

struct Chunk { std::size_t seg, lo, hi; };

}  // namespace

void lamb_cpu(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n,
              std::span<const Segment> segments, const LambHyper& h, std::span<float> coeffs) {
  detail::check_views(g, w, n, "lamb");
  const Segment whole{0, n};
  if (segments.empty()) segments = std::span<const Segment>(&whole, 1);
  detail::check_segments(segments, n, "lamb");
  DS_CHECK(coeffs.empty() || coeffs.size() == segments.size(),
           "lamb: coeffs holds " << coeffs.size() << " floats for " << segments.size() << " segments");

  std::vector<Chunk> chunks;
  chunks.reserve(n / kChunk + segments.size() + 1);
  for (std::size_t s = 0; s < segments.size(); ++s)
    for (std::size_t lo = segments[s].offset, end = lo + segments[s].count; lo < end; lo += kChunk)
      chunks.push_back({s, lo, std::min(end, lo + kChunk)});
  const std::ptrdiff_t nc = std::ptrdiff_t(chunks.size());
  std::vector<double> sums(2 * chunks.size());
  const simd::KernelSet* vec = simd::cpu_kernels();
  const bool par = n >= simd::kMinParallel && nc > 1;

  // Pass 1: moments + per-chunk squared norms.
#pragma omp parallel for schedule(static) if (par)
  for (std::ptrdiff_t c = 0; c < nc; ++c) {
    const Chunk& ch = chunks[std::size_t(c)];
    double* out = &sums[2 * std::size_t(c)];
    if (vec) {
      vec->lamb_pass1(p, m, v, g, ch.lo, ch.hi, h, out, out + 1);
    } else {
      double ps = 0, us = 0;
      for (std::size_t i = ch.lo; i < ch.hi; ++i) {
        detail::lamb_moments(detail::load_grad(g, i), m[i], v[i], h);
        const float u = detail::lamb_update_dir(m[i], v[i], p[i], h);
        ps += double(p[i]) * double(p[i]);
        us += double(u) * double(u);
      }
      out[0] = ps; out[1] = us;
    }
  }

  // Trust ratio per segment (chunk sums in order).
  std::vector<float> sc(segments.size());
  {
    std::size_t c = 0;
    for (std::size_t s = 0; s < segments.size(); ++s) {
      double ps = 0, us = 0;
      for (; c < chunks.size() && chunks[c].seg == s; ++c) { ps += sums[2 * c]; us += sums[2 * c + 1]; }
      const float coeff = lamb_trust_ratio(ps, us, h.min_coeff, h.max_coeff);
      if (!coeffs.empty()) coeffs[s] = coeff;
      sc[s] = h.step_size * coeff;
    }
  }

  // Pass 2: p -= (step_size*c) * u, working copy written.
  const bool nt = vec && simd::stream_working(w.data, n, w.dtype);
#pragma omp parallel for schedule(static) if (par)
  for (std::ptrdiff_t c = 0; c < nc; ++c) {
    const Chunk& ch = chunks[std::size_t(c)];
    if (vec) {
      vec->lamb_pass2(p, m, v, w, ch.lo, ch.hi, h, sc[ch.seg], nt);
    } else {
      for (std::size_t i = ch.lo; i < ch.hi; ++i) {
        const float u = detail::lamb_update_dir(m[i], v[i], p[i], h);
        p[i] = detail::lamb_apply(p[i], u, sc[ch.seg]);
        if (w.data) detail::store_working(w, i, p[i]);
      }
    }
  }
}

}  // namespace ds::optim
