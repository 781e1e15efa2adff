// Fast Lamb: pass 1 updates the moments and sums ||p||^2, ||u||^2 per segment; pass 2
// recomputes u from the stored moments (cheaper than storing it) and applies the trust
// ratio. Work is split into chunks that never cross a segment; chunk sums are combined in
// order, so the result does not depend on the thread count. Element math is that of lamb_ref
// (division: simd::fast_div); the norms differ in summation order (fp32 partial sums of 16
// squares per lane, then double): ~1e-7 relative on the trust ratio.
#include <vector>

#include "scalar_math.h"
#include "simd.h"

namespace ds::optim {
namespace {

constexpr std::size_t kChunk = 1 << 15;

struct Chunk { std::size_t seg, lo, hi; };

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
struct LambVec {
  __m512 gs, b1, b2, omb1, omb2, eps, wd;
  explicit LambVec(const LambHyper& h)
      : gs(_mm512_set1_ps(h.grad_scale)), b1(_mm512_set1_ps(h.beta1)), b2(_mm512_set1_ps(h.beta2)),
        omb1(_mm512_set1_ps(1.0f - h.beta1)), omb2(_mm512_set1_ps(1.0f - h.beta2)),
        eps(_mm512_set1_ps(h.eps)), wd(_mm512_set1_ps(h.weight_decay)) {}
};
inline __m512 lamb_dir(__m512 m, __m512 v, __m512 p, const LambVec& c, bool inside) {
  const __m512 denom = inside ? _mm512_sqrt_ps(_mm512_add_ps(v, c.eps)) : _mm512_add_ps(_mm512_sqrt_ps(v), c.eps);
  return _mm512_fmadd_ps(p, c.wd, simd::fast_div(m, denom));
}

template <DType G>
__attribute__((noinline)) void lamb_pass1_avx512(float* p, float* m, float* v, const void* g, std::size_t lo,
                                                 std::size_t hi, const LambHyper& h, double* p_sq, double* u_sq) {
  const LambVec c(h);
  // Squares are summed in fp32 lanes over 16 vectors (256 elements), then widened into
  // double accumulators: cheap, and the fp32 partial sums of 16 terms lose < 1e-6 relative.
  __m512d pa0 = _mm512_setzero_pd(), pa1 = _mm512_setzero_pd(), ua0 = _mm512_setzero_pd(), ua1 = _mm512_setzero_pd();
  __m512 pf = _mm512_setzero_ps(), uf = _mm512_setzero_ps();
  int in_block = 0;
  auto prefetch = [&](std::size_t i) {
    simd::prefetch_g32<G>(g, i);
    simd::prefetch32<4>(p, i);
    simd::prefetch32<4>(m, i);
    simd::prefetch32<4>(v, i);
  };
  simd::stream_loop(lo, hi, prefetch, [&](std::size_t i, __mmask16 k) {
    const __m512 gv = _mm512_mul_ps(simd::load_g<G>(g, i, k), c.gs);
    const __m512 pv = _mm512_maskz_loadu_ps(k, p + i);
    __m512 mv = _mm512_maskz_loadu_ps(k, m + i), vv = _mm512_maskz_loadu_ps(k, v + i);
    mv = _mm512_fmadd_ps(gv, c.omb1, _mm512_mul_ps(mv, c.b1));
    vv = _mm512_fmadd_ps(_mm512_mul_ps(gv, gv), c.omb2, _mm512_mul_ps(vv, c.b2));
    _mm512_mask_storeu_ps(m + i, k, mv);
    _mm512_mask_storeu_ps(v + i, k, vv);
    const __m512 u = _mm512_maskz_mov_ps(k, lamb_dir(mv, vv, pv, c, h.eps_inside_sqrt));  // masked lanes: 0
    pf = _mm512_fmadd_ps(pv, pv, pf);
    uf = _mm512_fmadd_ps(u, u, uf);
    if (++in_block == 16) {
      simd::acc_f32(pf, pa0, pa1);
      simd::acc_f32(uf, ua0, ua1);
      pf = uf = _mm512_setzero_ps();
      in_block = 0;
    }
  });
  simd::acc_f32(pf, pa0, pa1);
  simd::acc_f32(uf, ua0, ua1);
  *p_sq = _mm512_reduce_add_pd(_mm512_add_pd(pa0, pa1));
  *u_sq = _mm512_reduce_add_pd(_mm512_add_pd(ua0, ua1));
}

template <DType W, bool NT>
__attribute__((noinline)) void lamb_pass2_avx512(float* p, const float* m, const float* v, void* w, std::size_t lo,
                                                 std::size_t hi, const LambHyper& h, float sc) {
  const LambVec c(h);
  const __m512 nsc = _mm512_set1_ps(-sc);
  auto prefetch = [&](std::size_t i) {
    simd::prefetch32<4>(p, i);
    simd::prefetch32<4>(m, i);
    simd::prefetch32<4>(v, i);
    simd::prefetch_w32<W>(w, i, NT);
  };
  simd::stream_loop(lo, hi, prefetch, [&](std::size_t i, __mmask16 k) {
    __m512 pv = _mm512_maskz_loadu_ps(k, p + i);
    const __m512 u = lamb_dir(_mm512_maskz_loadu_ps(k, m + i), _mm512_maskz_loadu_ps(k, v + i), pv, c, h.eps_inside_sqrt);
    pv = _mm512_fmadd_ps(u, nsc, pv);
    _mm512_mask_storeu_ps(p + i, k, pv);
    if constexpr (W != simd::kNone) simd::store_w<W>(w, i, pv, k, NT);
  });
  if constexpr (NT) _mm_sfence();
}
#pragma GCC pop_options

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
  const bool vec = simd::have_avx512();
  const bool par = n >= simd::kMinParallel && nc > 1;

  // Pass 1: moments + per-chunk squared norms.
  auto pass1 = [&]<DType G>() {
#pragma omp parallel for schedule(static) if (par)
    for (std::ptrdiff_t c = 0; c < nc; ++c) {
      const Chunk& ch = chunks[std::size_t(c)];
      double* out = &sums[2 * std::size_t(c)];
      if (vec) {
        lamb_pass1_avx512<G>(p, m, v, g.data, ch.lo, ch.hi, h, out, out + 1);
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
  };
  switch (g.dtype) {
    case DType::F16: pass1.template operator()<DType::F16>(); break;
    case DType::BF16: pass1.template operator()<DType::BF16>(); break;
    default: pass1.template operator()<DType::F32>(); break;
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
  auto pass2 = [&]<DType W>() {
#pragma omp parallel for schedule(static) if (par)
    for (std::ptrdiff_t c = 0; c < nc; ++c) {
      const Chunk& ch = chunks[std::size_t(c)];
      if (vec) {
        if (nt) lamb_pass2_avx512<W, true>(p, m, v, w.data, ch.lo, ch.hi, h, sc[ch.seg]);
        else lamb_pass2_avx512<W, false>(p, m, v, w.data, ch.lo, ch.hi, h, sc[ch.seg]);
      } else {
        for (std::size_t i = ch.lo; i < ch.hi; ++i) {
          const float u = detail::lamb_update_dir(m[i], v[i], p[i], h);
          p[i] = detail::lamb_apply(p[i], u, sc[ch.seg]);
          if (w.data) detail::store_working(w, i, p[i]);
        }
      }
    }
  };
  switch (w.data ? w.dtype : simd::kNone) {
    case DType::F32: pass2.template operator()<DType::F32>(); break;
    case DType::F16: pass2.template operator()<DType::F16>(); break;
    case DType::BF16:
      if (vec && cpu_features().avx512_bf16) pass2.template operator()<simd::kBf16Native>();
      else pass2.template operator()<DType::BF16>();
      break;
    default: pass2.template operator()<simd::kNone>(); break;
  }
}

}  // namespace ds::optim
