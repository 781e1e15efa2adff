// Layer kernels: (1) finite-difference gradient checks of the reference kernels in double
// precision (central differences, h = 1e-5; |analytic - numeric| <= 1e-7 + 1e-5 |numeric|),
// (2) the fast fp32 kernels against the reference at awkward shapes (relative 1e-4 of the
// largest magnitude). Together: the fast backward kernels compute the true gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "ds/core/half.h"
#include "ds/nn/gemm.h"
#include "ds/nn/kernels.h"
#include "../../src/nn/src/layer_rows.h"
#include "kernels_ref.h"
#include "scoped_isa.h"
#include "same_bits.h"

namespace {

using Vd = std::vector<double>;
using Vf = std::vector<float>;

Vd randn(std::size_t n, std::uint64_t seed, double scale = 1.0) {
  std::mt19937_64 g(seed);
  std::normal_distribution<double> d(0.0, scale);
  Vd v(n);
  for (auto& x : v) x = d(g);
  return v;
}
Vf to_f(const Vd& v) { return Vf(v.begin(), v.end()); }
Vd to_d(const Vf& v) { return Vd(v.begin(), v.end()); }

double dot(const Vd& a, const Vd& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central-difference check of d f / d x against `grad`, over every element of x.
void fd_check(Vd& x, const Vd& grad, const std::function<double()>& f, const char* what) {
  const double h = 1e-5;
  ASSERT_EQ(x.size(), grad.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double fp = f();
    x[i] = keep - h;
    const double fm = f();
    x[i] = keep;
    const double num = (fp - fm) / (2 * h);
    ASSERT_NEAR(grad[i], num, 1e-7 + 1e-5 * std::fabs(num)) << what << " element " << i;
  }
}

void expect_close(const Vf& fast, const Vd& ref, double rtol, const char* what) {
  ASSERT_EQ(fast.size(), ref.size());
  double mx = 0;
  for (double r : ref) mx = std::max(mx, std::fabs(r));
  for (std::size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(fast[i], ref[i], rtol * (mx + 1e-30)) << what << " element " << i;
}

TEST(NnLayers, LinearGradientAndFast) {
  const std::int64_t N = 7, C = 5, OC = 3;
  Vd inp = randn(N * C, 1), w = randn(OC * C, 2), b = randn(OC, 3), res = randn(N * OC, 4), R = randn(N * OC, 5);
  Vd out(N * OC);
  auto f = [&] { ds::nn::ref::linear_forward(out.data(), inp.data(), w.data(), b.data(), res.data(), N, C, OC); return dot(out, R); };
  Vd dinp(N * C), dw(OC * C), db(OC);
  ds::nn::ref::linear_backward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), N, C, OC, false);
  fd_check(inp, dinp, f, "linear dinp");
  fd_check(w, dw, f, "linear dw");
  fd_check(b, db, f, "linear db");
  fd_check(res, R, f, "linear dresidual");

  // Fast vs reference at awkward sizes (with and without bias / residual, accumulate on);
  // n > 256 takes the weight gradient's packed dout^T path with the bias gradient summed
  // while packing (50 rows: a partial strip group), and n x c over 256 Ki the tile order
  // that keeps a column panel in L2.
  for (auto [n, c, oc] : {std::array<std::int64_t, 3>{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {300, 70, 50},
                          {520, 600, 13}}) {
    Vd i2 = randn(n * c, 6), w2 = randn(oc * c, 7), b2 = randn(oc, 8), r2 = randn(n * oc, 9), d2 = randn(n * oc, 10);
    Vd o_ref(n * oc), di_ref = randn(n * c, 11), dw_ref = randn(oc * c, 12), db_ref = randn(oc, 13);
    Vf o(n * oc), di = to_f(di_ref), dwf = to_f(dw_ref), dbf = to_f(db_ref);
    ds::nn::ref::linear_forward(o_ref.data(), i2.data(), w2.data(), b2.data(), r2.data(), n, c, oc);
    Vf i2f = to_f(i2), w2f = to_f(w2), b2f = to_f(b2), r2f = to_f(r2), d2f = to_f(d2);
    ds::nn::kernels::linear_forward(o.data(), i2f.data(), w2f.data(), b2f.data(), r2f.data(), n, c, oc);
    expect_close(o, o_ref, 1e-5, "linear fwd");
    ds::nn::ref::linear_forward<double>(o_ref.data(), i2.data(), w2.data(), nullptr, nullptr, n, c, oc);
    ds::nn::kernels::linear_forward(o.data(), i2f.data(), w2f.data(), nullptr, nullptr, n, c, oc);
    expect_close(o, o_ref, 1e-5, "linear fwd no bias");
    ds::nn::ref::linear_backward(di_ref.data(), dw_ref.data(), db_ref.data(), d2.data(), i2.data(), w2.data(), n, c, oc, true);
    ds::nn::kernels::linear_backward(di.data(), dwf.data(), dbf.data(), d2f.data(), i2f.data(), w2f.data(), n, c, oc, true);
    expect_close(di, di_ref, 1e-5, "linear dinp");
    expect_close(dwf, dw_ref, 1e-5, "linear dw");
    expect_close(dbf, db_ref, 1e-5, "linear db");
  }
}

// The Linear forward's epilogue forms on the own kernel (bias, separate residual, residual
// aliasing out) against the reference, at awkward sizes and a full-tile size.
TEST(NnLayers, LinearEpilogueFormsFast) {
  for (auto [n, c, oc] : {std::array<std::int64_t, 3>{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {70, 64, 260}}) {
    Vd i2 = randn(n * c, 61, 2.0), w2 = randn(oc * c, 62), b2 = randn(oc, 63), r2 = randn(n * oc, 64);
    Vf i2f = to_f(i2), w2f = to_f(w2), b2f = to_f(b2), r2f = to_f(r2);
    Vd o_ref(n * oc);
    ds::nn::ref::linear_forward(o_ref.data(), i2.data(), w2.data(), b2.data(), r2.data(), n, c, oc);
    Vf o(n * oc, 7.0f);
    ds::nn::kernels::linear_forward(o.data(), i2f.data(), w2f.data(), b2f.data(), r2f.data(), n, c, oc);
    expect_close(o, o_ref, 1e-5, "linear fwd bias + residual");
    // out += inp w^T (residual aliasing out, no bias).
    ds::nn::ref::linear_forward(o_ref.data(), i2.data(), w2.data(), static_cast<const double*>(nullptr), r2.data(),
                                n, c, oc);
    o = r2f;
    ds::nn::kernels::linear_forward(o.data(), i2f.data(), w2f.data(), nullptr, o.data(), n, c, oc);
    expect_close(o, o_ref, 1e-5, "linear fwd in-place residual");
    // bias only, over a dirty output
    ds::nn::ref::linear_forward(o_ref.data(), i2.data(), w2.data(), b2.data(), static_cast<const double*>(nullptr),
                                n, c, oc);
    std::fill(o.begin(), o.end(), 7.0f);
    ds::nn::kernels::linear_forward(o.data(), i2f.data(), w2f.data(), b2f.data(), nullptr, n, c, oc);
    expect_close(o, o_ref, 1e-5, "linear fwd bias");
  }
}

// The Linear layer at Precision::BF16 (the bf16 kernel with the epilogue: bias, residual,
// weight-gradient row sums) against the double reference on bf16-rounded GEMM inputs; the
// bias gradient sums the unrounded dout. Tolerance 1e-4 of the largest magnitude: bf16
// rounding the inputs differently would show at ~1e-3.
TEST(NnLayers, LinearBf16MatchesRoundedReference) {
  if (!ds::nn::bf16_gemm_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  const auto bf = ds::nn::Precision::BF16;
  auto rd = [](Vd v) {
    for (auto& x : v) x = ds::bf16_to_float(ds::float_to_bf16(float(x)));
    return v;
  };
  for (auto [n, c, oc] : {std::array<std::int64_t, 3>{1, 1, 1}, {7, 13, 5}, {33, 17, 65}, {300, 70, 50},
                          {130, 256, 64}}) {
    // Inputs are fp32 values (the kernel rounds them); the reference gets them rounded.
    const Vd i2 = to_d(to_f(randn(n * c, 71))), w2 = to_d(to_f(randn(oc * c, 72))), b2 = randn(oc, 73),
             r2 = randn(n * oc, 74), d2 = to_d(to_f(randn(n * oc, 75)));
    const Vd i2r = rd(i2), w2r = rd(w2);
    Vf i2f = to_f(i2), w2f = to_f(w2), b2f = to_f(b2), r2f = to_f(r2), d2f = to_f(d2);
    Vd o_ref(n * oc);
    ds::nn::ref::linear_forward(o_ref.data(), i2r.data(), w2r.data(), b2.data(), r2.data(), n, c, oc);
    Vf o(n * oc, 3.0f);
    ds::nn::kernels::linear_forward(o.data(), i2f.data(), w2f.data(), b2f.data(), r2f.data(), n, c, oc, bf);
    expect_close(o, o_ref, 1e-4, "bf16 linear fwd bias + residual");
    o = r2f;
    ds::nn::kernels::linear_forward(o.data(), i2f.data(), w2f.data(), nullptr, o.data(), n, c, oc, bf);
    ds::nn::ref::linear_forward(o_ref.data(), i2r.data(), w2r.data(), static_cast<const double*>(nullptr), r2.data(),
                                n, c, oc);
    expect_close(o, o_ref, 1e-4, "bf16 linear fwd in-place residual");
    Vd di_ref = randn(n * c, 76), dw_ref = randn(oc * c, 77), db_ref = randn(oc, 78), db_unused(oc);
    Vf di = to_f(di_ref), dwf = to_f(dw_ref), dbf = to_f(db_ref);
    for (std::int64_t r = 0; r < n; ++r)
      for (std::int64_t j = 0; j < oc; ++j) db_ref[j] += d2[r * oc + j];
    ds::nn::ref::linear_backward(di_ref.data(), dw_ref.data(), db_unused.data(), rd(d2).data(), i2r.data(),
                                 w2r.data(), n, c, oc, true);
    ds::nn::kernels::linear_backward(di.data(), dwf.data(), dbf.data(), d2f.data(), i2f.data(), w2f.data(), n, c, oc,
                                     true, bf);
    expect_close(di, di_ref, 1e-4, "bf16 linear dinp");
    expect_close(dwf, dw_ref, 1e-4, "bf16 linear dw");
    expect_close(dbf, db_ref, 1e-5, "bf16 linear db (unrounded dout)");
  }
}

TEST(NnLayers, LayerNormGradientAndFast) {
  const std::int64_t N = 3, C = 7;
  Vd x = randn(N * C, 21), w = randn(C, 22), b = randn(C, 23), R = randn(N * C, 24);
  Vd out(N * C), mean(N), rstd(N);
  auto f = [&] { ds::nn::ref::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C); return dot(out, R); };
  f();
  Vd dx(N * C), dw(C), db(C);
  ds::nn::ref::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, C);
  fd_check(x, dx, f, "layernorm dx");
  fd_check(w, dw, f, "layernorm dw");
  fd_check(b, db, f, "layernorm db");

  // 300 x 200: above the kernels' parallel threshold, 5 row chunks (the last partial).
  for (auto [n, c] : {std::array<std::int64_t, 2>{1, 1}, {7, 13}, {67, 259}, {300, 200}}) {
    Vd x2 = randn(n * c, 25, 3.0), w2 = randn(c, 26), b2 = randn(c, 27), d2 = randn(n * c, 28);
    Vd o_ref(n * c), m_ref(n), s_ref(n), dx_ref = randn(n * c, 29), dw_ref = randn(c, 30), db_ref = randn(c, 31);
    ds::nn::ref::layernorm_forward(o_ref.data(), m_ref.data(), s_ref.data(), x2.data(), w2.data(), b2.data(), n, c);
    ds::nn::ref::layernorm_backward(dx_ref.data(), dw_ref.data(), db_ref.data(), d2.data(), x2.data(), w2.data(), m_ref.data(), s_ref.data(), n, c);
    Vf x2f = to_f(x2), w2f = to_f(w2), b2f = to_f(b2), d2f = to_f(d2), o(n * c), m(n), s(n);
    Vf dxf = to_f(randn(n * c, 29)), dwf = to_f(randn(c, 30)), dbf = to_f(randn(c, 31));
    ds::nn::kernels::layernorm_forward(o.data(), m.data(), s.data(), x2f.data(), w2f.data(), b2f.data(), n, c);
    if (c > 1) expect_close(o, o_ref, 1e-4, "layernorm fwd");  // C = 1: output is b exactly in both
    ds::nn::kernels::layernorm_backward(dxf.data(), dwf.data(), dbf.data(), d2f.data(), x2f.data(), w2f.data(), m.data(), s.data(), n, c);
    expect_close(dxf, dx_ref, 1e-4, "layernorm dx");
    expect_close(dwf, dw_ref, 1e-4, "layernorm dw");
    expect_close(dbf, db_ref, 1e-4, "layernorm db");
  }
}

// The backward's dw / db sums go per fixed row chunk and the chunks add in order: the same
// bits on any number of threads (as the row-split GEMMs' outputs are).
TEST(NnLayers, LayerNormBackwardSameOnAnyThreadCount) {
  const std::int64_t n = 333, c = 130;
  Vf x = to_f(randn(n * c, 61, 2.0)), w = to_f(randn(c, 62)), b = to_f(randn(c, 63)), d = to_f(randn(n * c, 64));
  Vf o(n * c), m(n), s(n);
  ds::nn::kernels::layernorm_forward(o.data(), m.data(), s.data(), x.data(), w.data(), b.data(), n, c);
  auto run = [&](int threads) {
    return ds::test::on_threads(threads, [&] {
      std::vector<Vf> r{Vf(n * c, 0.5f), Vf(c, 0.25f), Vf(c, -0.25f)};
      ds::nn::kernels::layernorm_backward(r[0].data(), r[1].data(), r[2].data(), d.data(), x.data(), w.data(),
                                          m.data(), s.data(), n, c);
      return r;
    });
  };
  const auto one = run(1);
  for (int t : {2, 3}) {
    const auto many = run(t);
    for (std::size_t k = 0; k < one.size(); ++k)
      ASSERT_EQ(ds::test::first_bit_difference(many[k], one[k]), "") << "output " << k << " on " << t << " threads";
  }
}

TEST(NnLayers, GeluGradientAndFast) {
  const std::int64_t n = 11;
  Vd x = randn(n, 41, 2.0), R = randn(n, 42), out(n), dx(n);
  auto f = [&] { ds::nn::ref::gelu_forward(out.data(), x.data(), n); return dot(out, R); };
  ds::nn::ref::gelu_backward(dx.data(), x.data(), R.data(), n);
  fd_check(x, dx, f, "gelu dx");
  for (std::int64_t m : {1, 7, 278011}) {
    Vd x2 = randn(m, 43, 3.0), d2 = randn(m, 44), o_ref(m), dx_ref(m);
    x2[0] = 12.0;  // saturated tails
    if (m > 1) x2[1] = -12.0;
    ds::nn::ref::gelu_forward(o_ref.data(), x2.data(), m);
    ds::nn::ref::gelu_backward(dx_ref.data(), x2.data(), d2.data(), m);
    Vf x2f = to_f(x2), d2f = to_f(d2), o(m), dxf(m);
    ds::nn::kernels::gelu_forward(o.data(), x2f.data(), m);
    ds::nn::kernels::gelu_backward(dxf.data(), x2f.data(), d2f.data(), m);
    expect_close(o, o_ref, 1e-5, "gelu fwd");
    expect_close(dxf, dx_ref, 1e-5, "gelu bwd");
  }
}

TEST(NnLayers, AttentionGradientAndFast) {
  const std::int64_t B = 2, T = 5, C = 6, NH = 2;
  Vd qkv = randn(B * T * 3 * C, 51), R = randn(B * T * C, 52), out(B * T * C), att(B * NH * T * T);
  auto f = [&] { ds::nn::ref::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH); return dot(out, R); };
  f();
  Vd dqkv(qkv.size());
  ds::nn::ref::attention_backward(dqkv.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  fd_check(qkv, dqkv, f, "attention dqkv");

  for (auto [b, t, c, nh] : {std::array<std::int64_t, 4>{1, 1, 1, 1}, {2, 7, 6, 3}, {3, 33, 20, 4},
                               {2, 131, 128, 2}}) {
    Vd q2 = randn(b * t * 3 * c, 53), d2 = randn(b * t * c, 54), o_ref(b * t * c), a_ref(b * nh * t * t), dq_ref(q2.size());
    ds::nn::ref::attention_forward(o_ref.data(), a_ref.data(), q2.data(), b, t, c, nh);
    ds::nn::ref::attention_backward(dq_ref.data(), d2.data(), q2.data(), a_ref.data(), b, t, c, nh);
    Vf q2f = to_f(q2), d2f = to_f(d2), o(b * t * c), a(b * nh * t * t), dq(q2.size(), 7.0f);
    Vf scratch(std::size_t(t * t * 4));
    ds::nn::kernels::attention_forward(o.data(), a.data(), q2f.data(), b, t, c, nh);
    ds::nn::kernels::attention_backward(dq.data(), d2f.data(), q2f.data(), a.data(), b, t, c, nh, scratch.data(), 4);
    expect_close(o, o_ref, 1e-5, "attention fwd");
    expect_close(a, a_ref, 1e-5, "attention probs");
    expect_close(dq, dq_ref, 1e-5, "attention bwd");
  }
}

TEST(NnLayers, EmbeddingGradientAndFast) {
  const std::int64_t B = 2, T = 3, C = 5, V = 4;
  std::vector<std::int32_t> tok = {1, 3, 1, 0, 1, 1};  // repeats on purpose
  Vd wte = randn(V * C, 61), wpe = randn(T * C, 62), R = randn(B * T * C, 63), out(B * T * C);
  auto f = [&] { ds::nn::ref::embedding_forward(out.data(), tok.data(), wte.data(), wpe.data(), B, T, C); return dot(out, R); };
  Vd dwte(V * C), dwpe(T * C);
  ds::nn::ref::embedding_backward(dwte.data(), dwpe.data(), R.data(), tok.data(), B, T, C);
  fd_check(wte, dwte, f, "embedding dwte");
  fd_check(wpe, dwpe, f, "embedding dwpe");

  const std::int64_t b = 3, t = 7, c = 37, v = 5;
  std::vector<std::int32_t> tk(b * t);
  for (std::size_t i = 0; i < tk.size(); ++i) tk[i] = std::int32_t((i * 7) % v);
  Vd e = randn(v * c, 64), p = randn(t * c, 65), d = randn(b * t * c, 66), o_ref(b * t * c);
  Vd de_ref = randn(v * c, 67), dp_ref = randn(t * c, 68);
  ds::nn::ref::embedding_forward(o_ref.data(), tk.data(), e.data(), p.data(), b, t, c);
  ds::nn::ref::embedding_backward(de_ref.data(), dp_ref.data(), d.data(), tk.data(), b, t, c);
  Vf ef = to_f(e), pf = to_f(p), df = to_f(d), o(b * t * c), de = to_f(randn(v * c, 67)), dp = to_f(randn(t * c, 68));
  ds::nn::kernels::embedding_forward(o.data(), tk.data(), ef.data(), pf.data(), b, t, c);
  ds::nn::kernels::embedding_backward(de.data(), dp.data(), df.data(), tk.data(), b, t, c);
  expect_close(o, o_ref, 1e-6, "embedding fwd");
  expect_close(de, de_ref, 1e-5, "embedding dwte");
  expect_close(dp, dp_ref, 1e-5, "embedding dwpe");
}

TEST(NnLayers, CrossEntropyGradientAndFast) {
  const std::int64_t N = 5, V = 7;
  std::vector<std::int32_t> tg = {0, 6, 3, 3, 1};
  Vd logits = randn(N * V, 71, 2.0), lse(N);
  auto f = [&] { return ds::nn::ref::crossentropy_forward(lse.data(), logits.data(), tg.data(), N, V); };
  f();
  Vd g = logits;
  ds::nn::ref::crossentropy_backward(g.data(), lse.data(), tg.data(), N, V, 1.0);
  fd_check(logits, g, f, "crossentropy dlogits");

  for (auto [n, v] : {std::array<std::int64_t, 2>{1, 1}, {7, 13}, {1031, 257}}) {
    std::vector<std::int32_t> t2(n);
    for (std::int64_t i = 0; i < n; ++i) t2[i] = std::int32_t((i * 5 + 3) % v);
    Vd l2 = randn(n * v, 72, 4.0), lse_ref(n);
    const double loss_ref = ds::nn::ref::crossentropy_forward(lse_ref.data(), l2.data(), t2.data(), n, v);
    Vd g_ref = l2;
    ds::nn::ref::crossentropy_backward(g_ref.data(), lse_ref.data(), t2.data(), n, v, 3.0);
    Vf l2f = to_f(l2), lsef(n);
    const float loss = ds::nn::kernels::crossentropy_forward(lsef.data(), l2f.data(), t2.data(), n, v);
    EXPECT_NEAR(loss, loss_ref, 1e-5 * (1 + std::fabs(loss_ref)));
    ds::nn::kernels::crossentropy_backward(l2f.data(), lsef.data(), t2.data(), n, v, 3.0f);
    expect_close(l2f, g_ref, 1e-5, "crossentropy bwd");
  }
}

TEST(NnLayers, AddInplaceAwkwardSizes) {
  for (std::int64_t n : {1, 7, 278011}) {
    Vd a = randn(n, 81), b = randn(n, 82);
    Vf af = to_f(a), bf = to_f(b);
    ds::nn::kernels::add_inplace(af.data(), bf.data(), n);
    for (std::int64_t i = 0; i < n; ++i) ASSERT_FLOAT_EQ(af[i], float(a[i]) + float(b[i]));
  }
}

}  // namespace

// The layer row table gives the copy compiled for exactly the ISA in use (DS_CPU_ISA
// selects it), and every copy computes the same layer within float rounding.
TEST(NnLayers, LayerRowsFollowTheIsa) {
  const std::int64_t C = 77;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<float> x(C), w(C), b(C);
  for (auto* v : {&x, &w, &b})
    for (float& e : *v) e = u(rng);
  std::vector<float> first;
  for (ds::CpuIsa isa : ds_test::runnable_isas()) {
    ds_test::ScopedIsa scoped(ds::isa_name(isa));
    const ds::nn::kernels::LayerRows& rows = ds::nn::kernels::layer_rows();
    EXPECT_EQ(rows.isa, isa) << ds::isa_name(isa);
    std::vector<float> out(C);
    float mean = 0, rstd = 0;
    rows.ln_fwd_row(out.data(), &mean, &rstd, x.data(), w.data(), b.data(), C);
    if (first.empty()) first = out;
    for (std::int64_t i = 0; i < C; ++i) EXPECT_NEAR(out[i], first[i], 1e-5f) << ds::isa_name(isa) << " at " << i;
  }
}
