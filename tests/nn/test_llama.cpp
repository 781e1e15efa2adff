// The Llama-style decoder: its parameter layout, its kernels against the plain references of
// llama_ref.h, whole-model finite-difference gradient checks (grouped-query and multi-head
// attention, tied and untied embeddings) and the ds::Module contract (grad_ready, +=).
// The comparison with PyTorch is llama_vs_torch.py (it runs llama_torch_dump).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/nn/kernels.h"
#include "ds/nn/llama.h"
#include "ds/nn/llama_kernels.h"
#include "ds/nn/llama_layout.h"
#include "llama_ref.h"
#include "model_harness.h"

namespace {

using dstest::Harness;
namespace k = ds::nn::kernels;
namespace ref = ds::nn::ref;

std::vector<float> randn(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}
std::vector<double> to_d(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// max |a - b| / max |b|
double rel_err(const std::vector<float>& a, const std::vector<double>& b) {
  double d = 0, m = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
    m = std::max(m, std::fabs(b[i]));
  }
  return d / m;
}

ds::nn::LlamaConfig tiny(std::int64_t n_kv_head, bool tie) {
  ds::nn::LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = n_kv_head;
  c.n_embd = 16;  // head dim 4
  c.intermediate_size = 20;
  c.block_size = 8;
  c.vocab_size = 11;
  c.tie_embeddings = tie;
  return c;
}

// llama_index: every index points at the parameter of its role and layer; a tied head is the
// embedding.
TEST(LlamaLayout, IndexPointsAtEachRole) {
  using ds::nn::LlamaRole;
  for (bool tied : {false, true}) {
    ds::nn::LlamaConfig c = tiny(2, tied);
    c.n_layer = 3;
    const auto p = ds::nn::llama_parameters(c);
    const auto x = ds::nn::llama_index(c, p);
    auto is = [&](std::size_t id, LlamaRole role, std::int64_t layer) {
      ASSERT_LT(id, p.size());
      EXPECT_EQ(p[id].role, role) << p[id].name;
      EXPECT_EQ(p[id].layer, layer) << p[id].name;
    };
    is(x.embed, LlamaRole::Embedding, -1);
    is(x.normf, LlamaRole::FinalNorm, -1);
    if (tied) EXPECT_EQ(x.head, x.embed);
    else is(x.head, LlamaRole::LmHead, -1);
    ASSERT_EQ(x.layers.size(), 3u);
    for (std::int64_t l = 0; l < 3; ++l) {
      const auto& L = x.layers[std::size_t(l)];
      is(L.q, LlamaRole::QProj, l); is(L.k, LlamaRole::KProj, l); is(L.v, LlamaRole::VProj, l);
      is(L.o, LlamaRole::OProj, l); is(L.gate, LlamaRole::GateProj, l); is(L.up, LlamaRole::UpProj, l);
      is(L.down, LlamaRole::DownProj, l); is(L.ln1, LlamaRole::InputNorm, l); is(L.ln2, LlamaRole::PostAttnNorm, l);
    }
  }
}

TEST(LlamaLayout, HuggingFaceNamesShapesAndOrder) {
  ds::nn::LlamaConfig c = tiny(2, false);
  const auto p = ds::nn::llama_parameters(c);
  ASSERT_EQ(p.size(), 1u + 2 * 9 + 2);
  EXPECT_EQ(p[0].name, "model.embed_tokens.weight");
  EXPECT_EQ(p[0].shape, (std::vector<std::int64_t>{11, 16}));
  EXPECT_EQ(p[1].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(p[1].shape, (std::vector<std::int64_t>{16, 16}));
  EXPECT_EQ(p[2].name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(p[2].shape, (std::vector<std::int64_t>{8, 16}));  // 2 kv heads of 4
  EXPECT_EQ(p[3].name, "model.layers.0.self_attn.v_proj.weight");
  EXPECT_EQ(p[4].name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_EQ(p[5].name, "model.layers.0.mlp.gate_proj.weight");
  EXPECT_EQ(p[5].shape, (std::vector<std::int64_t>{20, 16}));
  EXPECT_EQ(p[7].name, "model.layers.0.mlp.down_proj.weight");
  EXPECT_EQ(p[7].shape, (std::vector<std::int64_t>{16, 20}));
  EXPECT_EQ(p[8].name, "model.layers.0.input_layernorm.weight");
  EXPECT_EQ(p[9].name, "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(p[9].layer, 0);
  EXPECT_EQ(p[18].name, "model.layers.1.post_attention_layernorm.weight");
  EXPECT_EQ(p[19].name, "model.norm.weight");
  EXPECT_EQ(p[20].name, "lm_head.weight");
  EXPECT_EQ(p[20].role, ds::nn::LlamaRole::LmHead);
  c.tie_embeddings = true;
  EXPECT_EQ(ds::nn::llama_parameters(c).back().name, "model.norm.weight");
  // The model reports exactly this list.
  ds::nn::Llama m(tiny(2, false));
  const auto infos = m.parameters();
  ASSERT_EQ(infos.size(), p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    EXPECT_EQ(infos[i].name, p[i].name);
    EXPECT_EQ(infos[i].shape, p[i].shape);
  }
}

TEST(LlamaLayout, DefaultIntermediateSize) {
  EXPECT_EQ(ds::nn::llama_default_intermediate(4096), 11008);  // Llama 7B
  EXPECT_EQ(ds::nn::llama_default_intermediate(5120), 13824);  // Llama 13B
  EXPECT_EQ(ds::nn::llama_default_intermediate(128), 344);
  EXPECT_EQ(ds::nn::llama_default_intermediate(32), 86);
  EXPECT_EQ(ds::nn::llama_default_intermediate(8), 21);
  ds::nn::LlamaConfig c = tiny(2, false);
  c.intermediate_size = 0;
  EXPECT_EQ(ds::nn::Llama(c).config().intermediate_size, ds::nn::llama_default_intermediate(16));
}

TEST(LlamaLayout, BadConfigsNameTheField) {
  auto message = [](ds::nn::LlamaConfig c) {
    try {
      ds::nn::validate(c);
    } catch (const ds::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ds::nn::LlamaConfig c = tiny(3, false);
  EXPECT_NE(message(c).find("n_head (4) must be divisible by n_kv_head (3)"), std::string::npos) << message(c);
  c = tiny(2, false);
  c.n_embd = 12;
  c.n_head = 4;  // head dim 3
  EXPECT_NE(message(c).find("must be even"), std::string::npos) << message(c);
  c = tiny(2, false);
  c.n_embd = 18;
  EXPECT_NE(message(c).find("n_embd (18) must be divisible by n_head (4)"), std::string::npos) << message(c);
  c = tiny(0, false);
  EXPECT_NE(message(c).find("must be > 0"), std::string::npos) << message(c);
  EXPECT_THROW(ds::nn::Llama{c}, ds::Error);
}

TEST(LlamaKernels, RmsNormMatchesReference) {
  const std::int64_t N = 37, C = 24;  // N * C over the threading threshold: no; also a big one below
  for (std::int64_t n : {N, std::int64_t(3000)}) {
    auto x = randn(std::size_t(n * C), 1), w = randn(static_cast<std::size_t>(C), 2), dy = randn(std::size_t(n * C), 3);
    for (float& v : w) v += 1.0f;
    std::vector<float> out(x.size()), rstd(static_cast<std::size_t>(n)), dx(x.size(), 0.5f), dw(static_cast<std::size_t>(C), 0.25f);
    k::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), n, C, 1e-5f);
    k::rmsnorm_backward(dx.data(), dw.data(), dy.data(), x.data(), w.data(), rstd.data(), n, C);
    auto xd = to_d(x), wd = to_d(w), dyd = to_d(dy);
    std::vector<double> o(x.size()), r(static_cast<std::size_t>(n)), dxd(x.size(), 0.5), dwd(static_cast<std::size_t>(C), 0.25);
    ref::rmsnorm_forward(o.data(), r.data(), xd.data(), wd.data(), n, C, 1e-5);
    ref::rmsnorm_backward(dxd.data(), dwd.data(), dyd.data(), xd.data(), wd.data(), r.data(), n, C);
    EXPECT_LT(rel_err(out, o), 1e-6);
    EXPECT_LT(rel_err(dx, dxd), 1e-5);
    EXPECT_LT(rel_err(dw, dwd), 1e-5);
  }
}

TEST(LlamaKernels, RopeMatchesReferenceAndBackwardIsItsTranspose) {
  const std::int64_t B = 2, T = 7, NH = 3, hd = 8, ld = NH * hd + 5;  // a row stride wider than the heads
  std::vector<float> cs(std::size_t(T * hd / 2)), sn(cs.size());
  k::rope_tables(cs.data(), sn.data(), T, hd, 10000.0);
  auto x = randn(std::size_t(B * T * ld), 4);
  auto y = x;
  k::rope_forward(y.data(), B * T, T, ld, NH, hd, cs.data(), sn.data());
  auto yd = to_d(x);
  ref::rope_forward(yd.data(), B * T, T, ld, NH, hd, 10000.0);
  EXPECT_LT(rel_err(y, yd), 1e-6);
  for (std::int64_t r = 0; r < B * T; ++r)  // the columns past the heads are untouched
    for (std::int64_t c = NH * hd; c < ld; ++c) EXPECT_EQ(y[std::size_t(r * ld + c)], x[std::size_t(r * ld + c)]);
  // <R x, g> == <x, R^T g>
  auto g = randn(x.size(), 5), gt = g;
  k::rope_backward(gt.data(), B * T, T, ld, NH, hd, cs.data(), sn.data());
  double a = 0, b = 0;
  for (std::size_t i = 0; i < x.size(); ++i) { a += double(y[i]) * g[i]; b += double(x[i]) * gt[i]; }
  EXPECT_NEAR(a, b, 1e-4 * std::fabs(a));
  // and R^T R = 1
  k::rope_backward(y.data(), B * T, T, ld, NH, hd, cs.data(), sn.data());
  EXPECT_LT(rel_err(y, to_d(x)), 1e-6);
}

TEST(LlamaKernels, SwigluMatchesReference) {
  const std::int64_t n = 50000;
  auto gt = randn(static_cast<std::size_t>(n), 6, 3.0f), up = randn(static_cast<std::size_t>(n), 7), dy = randn(static_cast<std::size_t>(n), 8);
  std::vector<float> out(static_cast<std::size_t>(n)), dg(static_cast<std::size_t>(n)), du(static_cast<std::size_t>(n));
  k::swiglu_forward(out.data(), gt.data(), up.data(), n);
  k::swiglu_backward(dg.data(), du.data(), dy.data(), gt.data(), up.data(), n);
  auto gd = to_d(gt), ud = to_d(up), dyd = to_d(dy);
  std::vector<double> o(static_cast<std::size_t>(n)), dgd(static_cast<std::size_t>(n)), dud(static_cast<std::size_t>(n));
  ref::swiglu_forward(o.data(), gd.data(), ud.data(), n);
  ref::swiglu_backward(dgd.data(), dud.data(), dyd.data(), gd.data(), ud.data(), n);
  EXPECT_LT(rel_err(out, o), 1e-6);
  EXPECT_LT(rel_err(dg, dgd), 1e-6);
  EXPECT_LT(rel_err(du, dud), 1e-6);
}

// q [B,T,NH*hd] and k, v [B,T,NKV*hd] inside rows of ld floats (the layout of a fused buffer).
struct AttCase {
  std::int64_t B = 2, T = 9, NH = 4, NKV, hd = 8;
  std::int64_t ldq() const { return NH * hd + 3; }
  std::int64_t ldkv() const { return NKV * hd + 1; }
};

TEST(LlamaKernels, GqaAttentionMatchesReferenceAndFiniteDifferences) {
  for (std::int64_t nkv : {1, 2, 4}) {
    AttCase a{.NKV = nkv};
    const std::int64_t N = a.B * a.T, C = a.NH * a.hd, KV = nkv * a.hd;
    auto q = randn(std::size_t(N * a.ldq()), 10), kk = randn(std::size_t(N * a.ldkv()), 11),
         v = randn(std::size_t(N * a.ldkv()), 12), dy = randn(std::size_t(N * C), 13);
    std::vector<float> out(std::size_t(N * C)), att(std::size_t(a.B * a.NH * a.T * a.T));
    k::gqa_attention_forward(out.data(), att.data(), q.data(), kk.data(), v.data(), a.ldq(), a.ldkv(), a.B, a.T,
                             a.NH, nkv, a.hd);
    auto qd = to_d(q), kd = to_d(kk), vd = to_d(v);
    std::vector<double> od(out.size()), attd(att.size());
    auto ref_fwd = [&] {
      ref::gqa_attention_forward(od.data(), attd.data(), qd.data(), kd.data(), vd.data(), a.ldq(), a.ldkv(), a.B,
                                 a.T, a.NH, nkv, a.hd);
    };
    ref_fwd();
    EXPECT_LT(rel_err(out, od), 1e-5) << "n_kv_head " << nkv;
    // Backward against central differences of sum(out * dy) in double.
    std::vector<float> dq(std::size_t(N * C)), dk(std::size_t(N * KV)), dv(std::size_t(N * KV)),
        scratch(std::size_t(a.T * a.T * 4));
    k::gqa_attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), q.data(), kk.data(), v.data(), a.ldq(),
                              a.ldkv(), att.data(), a.B, a.T, a.NH, nkv, a.hd, scratch.data(), 4);
    auto loss = [&] {
      ref_fwd();
      double s = 0;
      for (std::size_t i = 0; i < od.size(); ++i) s += od[i] * dy[i];
      return s;
    };
    auto check = [&](std::vector<double>& x, const std::vector<float>& grad, std::int64_t ld, std::int64_t width,
                     const char* what) {
      std::vector<double> num(grad.size());
      for (std::int64_t r = 0; r < N; ++r)
        for (std::int64_t c = 0; c < width; ++c) {
          double& e = x[std::size_t(r * ld + c)];
          const double keep = e;
          e = keep + 1e-5;
          const double lp = loss();
          e = keep - 1e-5;
          const double lm = loss();
          e = keep;
          num[std::size_t(r * width + c)] = (lp - lm) / 2e-5;
        }
      EXPECT_LT(rel_err(grad, num), 1e-4) << what << ", n_kv_head " << nkv;
    };
    check(qd, dq, a.ldq(), C, "dq");
    check(kd, dk, a.ldkv(), KV, "dk");
    check(vd, dv, a.ldkv(), KV, "dv");
  }
}

TEST(LlamaKernels, GqaWithAllHeadsIsTheGptAttention) {
  const std::int64_t B = 2, T = 13, NH = 3, hd = 8, C = NH * hd;
  auto qkv = randn(std::size_t(B * T * 3 * C), 20), dy = randn(std::size_t(B * T * C), 21);
  std::vector<float> o1(std::size_t(B * T * C)), o2(o1.size()), a1(std::size_t(B * NH * T * T)), a2(a1.size());
  k::attention_forward(o1.data(), a1.data(), qkv.data(), B, T, C, NH);
  k::gqa_attention_forward(o2.data(), a2.data(), qkv.data(), qkv.data() + C, qkv.data() + 2 * C, 3 * C, 3 * C, B, T,
                           NH, NH, hd);
  EXPECT_EQ(o1, o2);
  EXPECT_EQ(a1, a2);
  std::vector<float> dqkv(qkv.size()), dq(o1.size()), dk(o1.size()), dv(o1.size()), s(std::size_t(T * T * 8));
  k::attention_backward(dqkv.data(), dy.data(), qkv.data(), a1.data(), B, T, C, NH, s.data(), 8);
  k::gqa_attention_backward(dq.data(), dk.data(), dv.data(), dy.data(), qkv.data(), qkv.data() + C,
                            qkv.data() + 2 * C, 3 * C, 3 * C, a2.data(), B, T, NH, NH, hd, s.data(), 8);
  for (std::int64_t r = 0; r < B * T; ++r)
    for (std::int64_t c = 0; c < C; ++c) {
      const std::size_t i = std::size_t(r * C + c), j = std::size_t(r * 3 * C + c);
      ASSERT_EQ(dq[i], dqkv[j]);
      ASSERT_EQ(dk[i], dqkv[j + std::size_t(C)]);
      ASSERT_EQ(dv[i], dqkv[j + 2 * std::size_t(C)]);
    }
}

using dstest::TokenBatch;
using dstest::randomize;

// The whole-model gradient check (model_harness.h), as the GPT's: relative error < 2e-2.
void model_fd_check(Harness& h, ds::Module& m, const ds::Batch& b, int samples, const std::string& what) {
  const std::vector<double> rel = dstest::fd_relative_errors(h, m, b, samples);
  for (std::size_t i = 0; i < rel.size(); ++i) EXPECT_LT(rel[i], 2e-2) << what << ": parameter " << h.infos[i].name;
}

TEST(LlamaModel, GradientCheckGroupedQueryUntied) {
  ds::nn::Llama m(tiny(2, false));
  Harness h(m, 3);
  randomize(h, 11, 0.3f);
  TokenBatch tb(2, 6, 11, 5);
  model_fd_check(h, m, tb.batch, 24, "n_kv_head 2 of 4, untied");
}

TEST(LlamaModel, GradientCheckMultiHeadTied) {
  ds::nn::Llama m(tiny(4, true));
  Harness h(m, 3);
  randomize(h, 12, 0.3f);
  TokenBatch tb(2, 6, 11, 6);
  model_fd_check(h, m, tb.batch, 24, "n_kv_head == n_head, tied");
}

TEST(LlamaModel, GradientCheckOneKvHeadTiedShortSequence) {
  ds::nn::Llama m(tiny(1, true));
  Harness h(m, 3);
  randomize(h, 13, 0.3f);
  TokenBatch tb(3, 3, 11, 7);  // seq below block_size
  model_fd_check(h, m, tb.batch, 24, "n_kv_head 1, tied");
}

TEST(LlamaModel, InitGradReadyAndAccumulation) {
  ds::nn::Llama m(tiny(2, false));
  Harness h(m, 1);
  auto stdev = [](const std::vector<float>& v) { double s = 0; for (float x : v) s += double(x) * x; return std::sqrt(s / double(v.size())); };
  EXPECT_NEAR(stdev(h.master[1]), 0.02, 0.004);
  for (float v : h.master[8]) EXPECT_EQ(v, 1.0f);  // input_layernorm
  TokenBatch tb(2, 8, 11, 9);
  // Untrained: the loss is near ln V.
  EXPECT_NEAR(m.forward(tb.batch), std::log(11.0), 0.15);
  std::vector<int> calls(h.infos.size(), 0);
  std::vector<std::vector<float>> snap(h.infos.size());
  std::vector<std::size_t> order;
  m.backward(1.0f, [&](std::size_t i) {
    ASSERT_LT(i, h.infos.size());
    ++calls[i];
    order.push_back(i);
    snap[i] = h.grad(i);
  });
  for (std::size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(calls[i], 1) << h.infos[i].name;
    EXPECT_EQ(snap[i], h.grad(i)) << h.infos[i].name << " changed after grad_ready";
  }
  EXPECT_EQ(h.infos[order.front()].name, "lm_head.weight");
  EXPECT_EQ(h.infos[order.back()].name, "model.embed_tokens.weight");
  EXPECT_THROW(m.backward(1.0f, {}), ds::Error);  // no fresh forward
  // A second backward with scale 2 adds twice the gradient.
  m.forward(tb.batch);
  m.backward(2.0f, {});
  for (std::size_t i = 0; i < h.infos.size(); ++i) {
    const auto g = h.grad(i);
    for (std::size_t j = 0; j < g.size(); ++j)
      ASSERT_NEAR(g[j], 3.0f * snap[i][j], 1e-5f * (std::fabs(3.0f * snap[i][j]) + 1e-6f)) << h.infos[i].name;
  }
}

TEST(LlamaModel, HalfWorkingDtypesCloseToFp32AndGeneration) {
  for (ds::DType dt : {ds::DType::BF16, ds::DType::F16}) {
    ds::nn::Llama m32(tiny(2, true)), m16(tiny(2, true));
    Harness h32(m32, 4), h16(m16, 4, dt);
    TokenBatch tb(2, 8, 11, 10);
    const float l32 = m32.forward(tb.batch), l16 = m16.forward(tb.batch);
    EXPECT_NEAR(l16, l32, 2e-2f) << ds::dtype_name(dt);
    m16.backward(1.0f, {});
  }
  ds::nn::Llama m(tiny(2, false));
  Harness h(m, 4);
  randomize(h, 3, 0.3f);
  const std::vector<std::int32_t> ctx{1, 2, 3};
  const auto a = m.generate(ctx, 12, 0.8f, 5), b = m.generate(ctx, 12, 0.8f, 5);  // past block_size too
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 12u);
  for (auto t : a) EXPECT_TRUE(t >= 0 && t < 11);
  EXPECT_EQ(m.logits_last(ctx).size(), 11u);
  EXPECT_GT(m.flops_per_token(), 0.0);
}

TEST(LlamaModel, BadInputsGiveClearErrors) {
  ds::nn::Llama m(tiny(2, false));
  Harness h(m, 1);
  TokenBatch tb(1, 9, 11, 1);  // seq 9 > block_size 8
  try {
    m.forward(tb.batch);
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq 9 exceeds block_size 8"), std::string::npos) << e.what();
  }
  TokenBatch bad(1, 4, 11, 1);
  bad.in[2] = 11;
  EXPECT_THROW(m.forward(bad.batch), ds::Error);
}

}  // namespace
