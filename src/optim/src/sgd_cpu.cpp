// Fast SGD (momentum, dampening, nesterov, weight decay; torch semantics) and Adagrad:
// one pass, AVX-512. SGD is bitwise equal to sgd_ref; Adagrad too except its division
// (simd::fast_div, within 1 ulp and almost always exact).
#include "scalar_math.h"
#include "simd.h"

namespace ds::optim {
namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,f16c,fma")
template <DType G, DType W, bool NT>
__attribute__((noinline)) void sgd_avx512(float* p, float* buf, const void* g, void* w, std::size_t lo,
                                          std::size_t hi, const SgdHyper& h) {
  const __m512 gs = _mm512_set1_ps(h.grad_scale), wd = _mm512_set1_ps(h.weight_decay);
  const __m512 mom = _mm512_set1_ps(h.momentum), omd = _mm512_set1_ps(1.0f - h.dampening);
  const __m512 nlr = _mm512_set1_ps(-h.lr);
  auto prefetch = [&](std::size_t i) {
    simd::prefetch_g32<G>(g, i);
    simd::prefetch32<4>(p, i);
    if (buf != nullptr) simd::prefetch32<4>(buf, i);
    simd::prefetch_w32<W>(w, i, NT);
  };
  simd::stream_loop(lo, hi, prefetch, [&](std::size_t i, __mmask16 k) {
    __m512 gv = _mm512_mul_ps(simd::load_g<G>(g, i, k), gs);
    __m512 pv = _mm512_maskz_loadu_ps(k, p + i);
    gv = _mm512_fmadd_ps(pv, wd, gv);
    if (buf != nullptr) {
      __m512 b = h.first_step ? gv
                              : _mm512_fmadd_ps(gv, omd, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, buf + i), mom));
      _mm512_mask_storeu_ps(buf + i, k, b);
      gv = h.nesterov ? _mm512_fmadd_ps(b, mom, gv) : b;
    }
    pv = _mm512_fmadd_ps(gv, nlr, pv);
    _mm512_mask_storeu_ps(p + i, k, pv);
    if constexpr (W != simd::kNone) simd::store_w<W>(w, i, pv, k, NT);
  });
  if constexpr (NT) _mm_sfence();
}

template <DType G, DType W, bool NT>
__attribute__((noinline)) void adagrad_avx512(float* p, float* sum, const void* g, void* w, std::size_t lo,
                                              std::size_t hi, const AdagradHyper& h) {
  const __m512 gs = _mm512_set1_ps(h.grad_scale), wd = _mm512_set1_ps(h.weight_decay);
  const __m512 nclr = _mm512_set1_ps(-h.clr), eps = _mm512_set1_ps(h.eps);
  auto prefetch = [&](std::size_t i) {
    simd::prefetch_g32<G>(g, i);
    simd::prefetch32<4>(p, i);
    simd::prefetch32<4>(sum, i);
    simd::prefetch_w32<W>(w, i, NT);
  };
  simd::stream_loop(lo, hi, prefetch, [&](std::size_t i, __mmask16 k) {
    __m512 gv = _mm512_mul_ps(simd::load_g<G>(g, i, k), gs);
    __m512 pv = _mm512_maskz_loadu_ps(k, p + i);
    gv = _mm512_fmadd_ps(pv, wd, gv);
    __m512 s = _mm512_fmadd_ps(gv, gv, _mm512_maskz_loadu_ps(k, sum + i));
    const __m512 stdv = _mm512_add_ps(_mm512_sqrt_ps(s), eps);
    pv = _mm512_fmadd_ps(simd::fast_div(gv, stdv), nclr, pv);
    _mm512_mask_storeu_ps(sum + i, k, s);
    _mm512_mask_storeu_ps(p + i, k, pv);
    if constexpr (W != simd::kNone) simd::store_w<W>(w, i, pv, k, NT);
  });
  if constexpr (NT) _mm_sfence();
}
#pragma GCC pop_options

}  // namespace

void sgd_cpu(float* p, float* buf, TensorView g, TensorView w, std::size_t n, const SgdHyper& h) {
  detail::check_views(g, w, n, "sgd");
  DS_CHECK(buf != nullptr || h.momentum == 0.f, "sgd: momentum " << h.momentum << " needs a momentum buffer");
  if (simd::have_avx512()) {
    const bool nt = simd::stream_working(w.data, n, w.dtype);
    simd::dispatch(g.dtype, w.data ? w.dtype : simd::kNone, [&]<DType G, DType W>() {
      simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
        if (nt) sgd_avx512<G, W, true>(p, buf, g.data, w.data, lo, hi, h);
        else sgd_avx512<G, W, false>(p, buf, g.data, w.data, lo, hi, h);
      });
    });
    return;
  }
  simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      p[i] = detail::sgd_elem(detail::load_grad(g, i), buf ? buf + i : nullptr, p[i], h);
      if (w.data) detail::store_working(w, i, p[i]);
    }
  });
}

void adagrad_cpu(float* p, float* sum, TensorView g, TensorView w, std::size_t n, const AdagradHyper& h) {
  detail::check_views(g, w, n, "adagrad");
  if (simd::have_avx512()) {
    const bool nt = simd::stream_working(w.data, n, w.dtype);
    simd::dispatch(g.dtype, w.data ? w.dtype : simd::kNone, [&]<DType G, DType W>() {
      simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
        if (nt) adagrad_avx512<G, W, true>(p, sum, g.data, w.data, lo, hi, h);
        else adagrad_avx512<G, W, false>(p, sum, g.data, w.data, lo, hi, h);
      });
    });
    return;
  }
  simd::parallel_ranges(n, [&](std::size_t lo, std::size_t hi) {
    for (std::size_t i = lo; i < hi; ++i) {
      p[i] = detail::adagrad_elem(detail::load_grad(g, i), sum[i], p[i], h);
      if (w.data) detail::store_working(w, i, p[i]);
    }
  });
}

}  // namespace ds::optim
