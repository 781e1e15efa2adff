// Fast Adam/AdamW: one pass, AVX-512, fp16/bf16 gradient read and working write fused. The
// same IEEE operations, FMAs included, in the same order as adam_ref, except the division
// (simd::fast_div: correctly rounded but for underflowing remainders, then within 1 ulp).
#include "scalar_math.h"
#include "simd.h"

namespace ds::optim {
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
template <DType G, DType W, bool NT>
__attribute__((noinline)) void adam_avx512(float* p, float* m, float* v, const void* g, void* w,
                                           std::size_t lo, std::size_t hi, const AdamHyper& h,
                                           const detail::AdamDerived& d) {
  const __m512 gs = _mm512_set1_ps(h.grad_scale), wd = _mm512_set1_ps(h.weight_decay);
  const __m512 b1 = _mm512_set1_ps(h.beta1), b2 = _mm512_set1_ps(h.beta2);
  const __m512 omb1 = _mm512_set1_ps(d.omb1), omb2 = _mm512_set1_ps(d.omb2);
  const __m512 nlw = _mm512_set1_ps(d.neg_lr_wd), step = _mm512_set1_ps(d.step);
  const __m512 rbc2 = _mm512_set1_ps(d.rbc2), eps = _mm512_set1_ps(h.eps);
  const bool l2 = !h.adam_w_mode;
  auto prefetch = [&](std::size_t i) {
    simd::prefetch_g32<G>(g, i);
    simd::prefetch32<4>(p, i);
    simd::prefetch32<4>(m, i);
    simd::prefetch32<4>(v, i);
    simd::prefetch_w32<W>(w, i, NT);
  };
  simd::stream_loop(lo, hi, prefetch, [&](std::size_t i, __mmask16 k) {
    __m512 gv = _mm512_mul_ps(simd::load_g<G>(g, i, k), gs);
    __m512 pv = _mm512_maskz_loadu_ps(k, p + i);
    __m512 mv = _mm512_maskz_loadu_ps(k, m + i);
    __m512 vv = _mm512_maskz_loadu_ps(k, v + i);
    if (l2) gv = _mm512_fmadd_ps(pv, wd, gv);
    mv = _mm512_fmadd_ps(gv, omb1, _mm512_mul_ps(mv, b1));
    vv = _mm512_fmadd_ps(_mm512_mul_ps(gv, gv), omb2, _mm512_mul_ps(vv, b2));
    pv = _mm512_fmadd_ps(pv, nlw, pv);
    const __m512 denom = _mm512_fmadd_ps(_mm512_sqrt_ps(vv), rbc2, eps);
    pv = _mm512_fmadd_ps(simd::fast_div(mv, denom), step, pv);
    _mm512_mask_storeu_ps(m + i, k, mv);
    _mm512_mask_storeu_ps(v + i, k, vv);
    _mm512_mask_storeu_ps(p + i, k, pv);
    if constexpr (W != simd::kNone) simd::store_w<W>(w, i, pv, k, NT);
  });
  if constexpr (NT) _mm_sfence();
}
#pragma GCC pop_options

}  // namespace

void adam_cpu(float* p, float* m, float* v, TensorView g, TensorView w, std::size_t n, const AdamHyper& h) {
  detail::check_views(g, w, n, "adam");
  const detail::AdamDerived d = detail::adam_derived(h);
  if (simd::have_avx512()) {
    const bool nt = simd::stream_working(w.data, n, w.dtype);
    simd::dispatch(g.dtype, w.data ? w.dtype : simd::kNone, [&]<DType G, DType W>() {
      simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
        if (nt) adam_avx512<G, W, true>(p, m, v, g.data, w.data, lo, hi, h, d);
        else adam_avx512<G, W, false>(p, m, v, g.data, w.data, lo, hi, h, d);
      });
    });
    return;
  }
  simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      p[i] = detail::adam_elem(detail::load_grad(g, i), m[i], v[i], p[i], h, d);
      if (w.data) detail::store_working(w, i, p[i]);
    }
  });
}

}  // namespace ds::optim
