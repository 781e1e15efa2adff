// The built-in models through the ds::Module contract: whole-model finite-difference
// gradient checks, grad_ready semantics, += accumulation, fp16/bf16 working dtypes, the
// untrained loss, and a short training run that must lower the loss.
#include <bit>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <random>
#include <vector>

#include "ds/core/cpu_features.h"
#include "ds/core/error.h"
#include "ds/data/dataset.h"
#include "ds/data/sampler.h"
#include "ds/nn/gemm.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/nn/params.h"
#include "ds/nn/mlp.h"
#include "model_harness.h"
#include "same_bits.h"

namespace {

using dstest::Harness;

using dstest::TokenBatch;
using dstest::randomize;

// The whole-model gradient check (model_harness.h): relative error < 2e-2 per parameter tensor.
void model_fd_check(Harness& h, ds::Module& m, const ds::Batch& b, int samples) {
  const std::vector<double> rel = dstest::fd_relative_errors(h, m, b, samples);
  for (std::size_t i = 0; i < rel.size(); ++i) EXPECT_LT(rel[i], 2e-2) << "parameter " << h.infos[i].name;
}

ds::nn::GptConfig tiny_gpt() { return {2, 3, 12, 7, 11}; }  // awkward: head dim 4, vocab 11

TEST(NnModels, GptParameterNamesAndInit) {
  ds::nn::Gpt m({2, 2, 8, 16, 256});
  auto p = m.parameters();
  ASSERT_EQ(p.size(), 2u + 2 * 12 + 2);
  EXPECT_EQ(p[0].name, "wte.weight");
  EXPECT_EQ(p[1].name, "wpe.weight");
  EXPECT_EQ(p[2].name, "h.0.ln_1.weight");
  EXPECT_EQ(p[4].name, "h.0.attn.c_attn.weight");
  EXPECT_EQ(p[4].shape, (std::vector<std::int64_t>{24, 8}));
  EXPECT_EQ(p[12].name, "h.0.mlp.c_proj.weight");
  EXPECT_EQ(p.back().name, "ln_f.bias");
  Harness h(m, 1);
  auto stdev = [](const std::vector<float>& v) { double s = 0; for (float x : v) s += double(x) * x; return std::sqrt(s / double(v.size())); };
  EXPECT_NEAR(stdev(h.master[0]), 0.02, 0.002);
  EXPECT_NEAR(stdev(h.master[12]), 0.02 / std::sqrt(4.0), 0.003);  // residual projection
  for (float v : h.master[2]) EXPECT_EQ(v, 1.0f);
  for (float v : h.master[5]) EXPECT_EQ(v, 0.0f);
  // Same seed, same values; different seed, different values.
  ds::nn::Gpt m2({2, 2, 8, 16, 256});
  Harness h2(m2, 1);
  EXPECT_EQ(h.master[4], h2.master[4]);
  ds::nn::Gpt m3({2, 2, 8, 16, 256});
  Harness h3(m3, 2);
  EXPECT_NE(h.master[4], h3.master[4]);
}

TEST(NnModels, GptGradientCheck) {
  ds::nn::Gpt m(tiny_gpt());
  Harness h(m, 3);
  randomize(h, 11, 0.3f);
  TokenBatch tb(2, 5, 11, 5);
  model_fd_check(h, m, tb.batch, 24);
}

TEST(NnModels, MlpGradientCheck) {
  ds::nn::Mlp m({5, 9, 3, 2});
  Harness h(m, 3);
  std::vector<float> feats(4 * 5);
  std::mt19937_64 g(1);
  std::normal_distribution<float> d;
  for (auto& f : feats) f = d(g);
  std::vector<std::int32_t> tg = {0, 2, 1, 2};
  ds::Batch b;
  b.features = feats;
  b.targets = tg;
  b.batch = 4;
  b.feature_dim = 5;
  model_fd_check(h, m, b, 24);
}

// Runs f(threads) on 1 thread and on 2 (where the GPT runs the per-thread backward),
// whatever the machine's core count.
template <class F>
void on_1_and_2_threads(F&& f) {
  for (int threads : {1, 2}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    ds::test::on_threads(threads, [&] {
      f(threads);
      return 0;
    });
  }
}

// On 1 thread and on 2 (where each thread runs the backward on its own sequence and the
// grad_ready calls come from thread 0 inside the parallel region), whatever the machine's
// core count.
TEST(NnModels, GradReadyOncePerParamAfterItsGradient) {
  on_1_and_2_threads([&](int) {
    ds::nn::Gpt m(tiny_gpt());
    Harness h(m, 3);
    TokenBatch tb(2, 7, 11, 9);
    m.forward(tb.batch);
    std::vector<int> calls(h.infos.size(), 0);
    std::vector<std::size_t> order;
    std::map<std::size_t, std::vector<float>> snap;
    m.backward(1.0f, [&](std::size_t i) {
      ASSERT_LT(i, h.infos.size());
      calls[i]++;
      order.push_back(i);
      snap[i] = h.grad(i);  // must already be final
    });
    for (std::size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i], 1) << h.infos[i].name;
    for (std::size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(snap[i], h.grad(i)) << h.infos[i].name;
    // Reverse layer order: ln_f first, layer 1 before layer 0, embeddings last.
    EXPECT_EQ(h.infos[order.front()].name.rfind("ln_f", 0), 0u);
    EXPECT_EQ(h.infos[order.back()].name, "wte.weight");
    auto pos = [&](const std::string& n) { for (std::size_t k = 0; k < order.size(); ++k) if (h.infos[order[k]].name == n) return k; return order.size(); };
    EXPECT_LT(pos("h.1.ln_1.weight"), pos("h.0.mlp.c_proj.weight"));
    EXPECT_LT(pos("h.0.ln_1.bias"), pos("wpe.weight"));
    // Backward without a fresh forward is an error.
    EXPECT_THROW(m.backward(1.0f, {}), ds::Error);
    // An exception from grad_ready (an engine's failed collective, say) reaches the caller,
    // on 2 threads too, where grad_ready runs inside the backward's parallel region (an
    // exception leaving an OpenMP region would terminate the process instead); no report
    // follows it, and a fresh forward makes the model usable again.
    m.forward(tb.batch);
    int before_throw = 0;
    EXPECT_THROW(m.backward(1.0f, [&](std::size_t) {
      if (++before_throw == 3) throw ds::Error("grad_ready failed");
    }), ds::Error);
    EXPECT_EQ(before_throw, 3);
    m.forward(tb.batch);
    int after = 0;
    m.backward(1.0f, [&](std::size_t) { ++after; });
    EXPECT_EQ(after, int(h.infos.size()));
  });
}

TEST(NnModels, BackwardAccumulatesAndScales) {
  // Half dtypes: the Linear weights' gradients go straight into the 16-bit storage (see
  // ParamSet::set_direct_grad), the rest through the folded fp32 shadow; both accumulate. On
  // 2 threads each thread runs the backward on its own sequence, the second into a partial
  // that is overwritten or zeroed every time and added to the gradients.
  on_1_and_2_threads([&](int threads) {
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16, ds::DType::F16}) {
      ds::nn::Gpt m(tiny_gpt());
      Harness h(m, 3, dt);
      TokenBatch tb(2, 6, 11, 13);
      m.forward(tb.batch);
      m.backward(1.0f, {});
      std::vector<std::vector<float>> once;
      for (std::size_t i = 0; i < h.infos.size(); ++i) once.push_back(h.grad(i));
      m.forward(tb.batch);
      m.backward(2.0f, {});
      const float tol = dt == ds::DType::F32 ? 1e-5f : 2e-2f;
      // fp16 gradients this small are subnormal: steps of 2^-24 (6e-8), two roundings. On 2
      // threads an fp32 gradient is the sum of two partials, rounded relative to them: where
      // they nearly cancel (gradients down to ~1e-5 here), relative to gradients of ~1e-4.
      const float abs_tol = dt == ds::DType::F16 ? 1.2e-7f : 0.0f;
      const float floor = dt == ds::DType::F32 && threads > 1 ? 1e-4f : 1e-6f;
      for (std::size_t i = 0; i < h.infos.size(); ++i) {
        const auto twice = h.grad(i);
        for (std::size_t j = 0; j < twice.size(); ++j)
          ASSERT_NEAR(twice[j], 3.0f * once[i][j], tol * (std::fabs(3.0f * once[i][j]) + floor) + abs_tol)
              << ds::dtype_name(dt) << " " << h.infos[i].name << " on " << threads << " threads";
      }
    }
  });
}

// The forward runs each thread on its own sequences, and so does the backward, each thread
// into its own gradient partial (thread 0 into the gradients), each parameter's partials
// added in thread order once every thread has passed it. So on the own GEMM kernels the loss is the same bits on 1, 2 and 3 threads,
// the gradients the same bits run to run on each thread count, and across thread counts only
// the summation order differs (at B 1 the backward runs on one thread, its ops split between
// the threads instead; with 3 threads on a batch of 2, one thread idle).
TEST(NnModels, GptLossSameBitsAndGradientsCloseOnAnyThreadCount) {
  // OpenBLAS (DS_NN_GEMM=openblas, or no AVX-512) picks its kernels by shape: another row
  // split of the forward can change its sums by an ulp.
  if (!ds::nn::own_f32_for_layers()) GTEST_SKIP() << "the Linear GEMMs run on OpenBLAS";
  for (std::int64_t B : {1, 2, 5}) {
    auto run = [&](int threads) {
      return ds::test::on_threads(threads, [&] {
        // Large enough that the backward's GELU and larger GEMMs split between threads too.
        ds::nn::Gpt m(ds::nn::GptConfig{2, 2, 64, 32, 64});
        Harness h(m, 3, ds::DType::F32);
        TokenBatch tb(B, 32, 64, 17);
        std::vector<float> out{m.forward(tb.batch)};
        m.backward(1.0f, {});
        for (std::size_t i = 0; i < h.infos.size(); ++i) {
          const auto g = h.grad(i);
          out.insert(out.end(), g.begin(), g.end());
        }
        return out;
      });
    };
    const std::vector<float> one = run(1);
    for (int t : {2, 3}) {
      const std::vector<float> a = run(t), b = run(t);
      ASSERT_EQ(ds::test::first_bit_difference(a, b), "") << "B " << B << ": two runs on " << t << " threads";
      ASSERT_EQ(a.size(), one.size());
      ASSERT_EQ(std::bit_cast<std::uint32_t>(a[0]), std::bit_cast<std::uint32_t>(one[0]))
          << "B " << B << ": the loss on " << t << " threads, " << a[0] << " against " << one[0];
      float gmax = 0.0f, dmax = 0.0f;
      for (std::size_t i = 1; i < a.size(); ++i) {
        gmax = std::max(gmax, std::abs(one[i]));
        dmax = std::max(dmax, std::abs(a[i] - one[i]));
      }
      std::printf("B %ld, %d threads: largest gradient difference %.3g (largest gradient %.3g)\n", long(B), t,
                  double(dmax), double(gmax));
      EXPECT_LE(dmax, 2e-6f * gmax) << "B " << B << " on " << t << " threads";
      if (B == 1) {
        EXPECT_EQ(ds::test::first_bit_difference(a, one), "") << "B 1 on " << t << " threads";
      }
    }
  }
}

// Half working dtypes on 2 threads: each thread's backward on its own sequences, the Linear
// weights' gradients through the fp32 shadow (not straight into the 16-bit storage as on 1
// thread) with the other thread's partial added, then one rounding to the half type. Only
// the fp32 summation order differs from 1 thread, so every gradient is within one rounding
// step of the half type of the 1-thread one.
TEST(NnModels, HalfDtypesPerThreadBackwardWithinOneRounding) {
  const ds::nn::GptConfig cfg{2, 2, 64, 32, 64};
  const TokenBatch tb(4, 32, 64, 19);
  for (ds::DType dt : {ds::DType::BF16, ds::DType::F16}) {
    auto grads = [&](int threads) {
      return ds::test::on_threads(threads, [&] {
        ds::nn::Gpt m(cfg);
        Harness h(m, 7, dt);
        m.forward(tb.batch);
        m.backward(1.0f, {});
        std::vector<std::vector<float>> out;
        for (std::size_t i = 0; i < h.infos.size(); ++i) out.push_back(h.grad(i));
        return out;
      });
    };
    const auto one = grads(1), two = grads(2);
    ASSERT_EQ(one.size(), two.size());
    // One rounding step at |x|: 2^-7 |x| for bf16 (8 significant bits), 2^-10 |x| for fp16,
    // plus fp16's subnormal step 2^-24; and where contributions nearly cancel, the fp32
    // summation order's 2e-6 of the parameter's largest gradient (as in fp32, above).
    const double rel = dt == ds::DType::BF16 ? 1.0 / 128 : 1.0 / 1024, abs = dt == ds::DType::F16 ? 6e-8 : 0.0;
    std::size_t differ = 0, total = 0;
    for (std::size_t p = 0; p < one.size(); ++p) {
      double gmax = 0;
      for (float x : one[p]) gmax = std::max(gmax, std::abs(double(x)));
      for (std::size_t i = 0; i < one[p].size(); ++i) {
        const double a = one[p][i], b = two[p][i];
        differ += a != b;
        ASSERT_LE(std::abs(b - a), rel * std::abs(a) + abs + 2e-6 * gmax)
            << ds::dtype_name(dt) << " parameter " << p << " element " << i << ": " << b << " on 2 threads, " << a
            << " on 1";
      }
      total += one[p].size();
    }
    const std::string name(ds::dtype_name(dt));
    std::printf("%s: %zu of %zu gradient values differ between 1 and 2 threads\n", name.c_str(), differ, total);
  }
}

// On 1 thread and on 2 (the per-thread backward, the Linear weights' gradients through the
// fp32 shadow), whatever the machine's core count.
TEST(NnModels, HalfWorkingDtypesCloseToFp32) {
  on_1_and_2_threads([&](int) {
    ds::nn::GptConfig cfg{2, 2, 16, 8, 32};
    TokenBatch tb(3, 8, 32, 17);
    ds::nn::Gpt m32(cfg);
    Harness h32(m32, 5);
    const float l32 = m32.forward(tb.batch);
    m32.backward(1.0f, {});
    for (ds::DType dt : {ds::DType::F16, ds::DType::BF16}) {
      ds::nn::Gpt m(cfg);
      Harness h(m, 5, dt);
      const float l = m.forward(tb.batch);
      EXPECT_NEAR(l, l32, 1e-2 * l32) << ds::dtype_name(dt);
      int calls = 0;
      m.backward(1.0f, [&](std::size_t) { ++calls; });
      EXPECT_EQ(calls, int(h.infos.size()));
      for (std::size_t i = 0; i < h.infos.size(); ++i) {
        auto a = h.grad(i), b = h32.grad(i);
        double dot = 0, na = 0, nb = 0;
        for (std::size_t j = 0; j < a.size(); ++j) { dot += double(a[j]) * b[j]; na += double(a[j]) * a[j]; nb += double(b[j]) * b[j]; }
        if (nb > 0) {
          EXPECT_GT(dot / std::sqrt(na * nb + 1e-30), 0.98) << ds::dtype_name(dt) << " " << h.infos[i].name;
        }
      }
    }
  });
}

TEST(NnModels, UntrainedLossIsLn256AndGenerationWorks) {
  ds::nn::Gpt m({2, 4, 32, 64, 256});
  Harness h(m, 42);
  auto data = ds::data::TextDataset::embedded();
  ds::data::Loader loader(data, 64, ds::data::DistributedSampler(data.num_samples(64), 1, 0, 4, true, 1));
  const float loss = m.forward(loader.next());
  EXPECT_NEAR(loss, std::log(256.0f), 0.1f);
  std::vector<std::int32_t> ctx = {'T', 'h', 'e'};
  auto a = m.generate(ctx, 10, 1.0f, 3);
  auto b = m.generate(ctx, 10, 1.0f, 3);
  EXPECT_EQ(a.size(), 10u);
  EXPECT_EQ(a, b);
  for (auto t : a) EXPECT_TRUE(t >= 0 && t < 256);
  EXPECT_EQ(m.logits_last(ctx).size(), 256u);
  // 6N + 12 L C T.
  const double n = 2 * 12 * 32.0 * 32 + 256 * 32.0;
  EXPECT_DOUBLE_EQ(m.flops_per_token(), 6 * n + 12 * 2 * 32.0 * 64);
}

// A tiny GPT trained with a plain AdamW loop written here (no engine) must lower the loss on
// the embedded corpus.
TEST(NnModels, TinyGptLearnsTheCorpus) {
  ds::nn::Gpt m({2, 2, 32, 32, 256});
  Harness h(m, 1);
  auto data = ds::data::TextDataset::embedded();
  ds::data::Loader loader(data, 32, ds::data::DistributedSampler(data.num_samples(32), 1, 0, 8, true, 1));
  std::vector<std::vector<float>> mom(h.master.size()), var(h.master.size());
  for (std::size_t i = 0; i < h.master.size(); ++i) { mom[i].assign(h.master[i].size(), 0); var[i].assign(h.master[i].size(), 0); }
  float first = 0, last = 0;
  const int steps = 60;
  for (int s = 1; s <= steps; ++s) {
    const float loss = m.forward(loader.next());
    if (s == 1) first = loss;
    if (s > steps - 10) last += loss / 10;
    h.zero_grads();
    m.backward(1.0f, {});
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.999f;
    for (std::size_t i = 0; i < h.master.size(); ++i)
      for (std::size_t j = 0; j < h.master[i].size(); ++j) {
        const float g = h.g32[i][j];
        mom[i][j] = b1 * mom[i][j] + (1 - b1) * g;
        var[i][j] = b2 * var[i][j] + (1 - b2) * g * g;
        const float mh = mom[i][j] / (1 - std::pow(b1, float(s))), vh = var[i][j] / (1 - std::pow(b2, float(s)));
        h.master[i][j] -= lr * (mh / (std::sqrt(vh) + 1e-8f) + 0.01f * h.master[i][j]);
      }
  }
  EXPECT_NEAR(first, std::log(256.0f), 0.15f);
  EXPECT_LT(last, 3.3f) << "first " << first;
}

TEST(NnModels, MlpLearnsSeparableData) {
  ds::nn::Mlp m({4, 16, 3, 1});
  Harness h(m, 2);
  const std::int64_t B = 32;
  std::vector<float> feats(B * 4);
  std::vector<std::int32_t> tg(B);
  std::mt19937_64 g(3);
  std::normal_distribution<float> d(0.0f, 0.3f);
  for (std::int64_t i = 0; i < B; ++i) {
    tg[i] = std::int32_t(i % 3);
    for (int f = 0; f < 4; ++f) feats[i * 4 + f] = d(g) + (f == tg[i] ? 2.0f : 0.0f);
  }
  ds::Batch b;
  b.features = feats;
  b.targets = tg;
  b.batch = B;
  b.feature_dim = 4;
  float first = 0, loss = 0;
  for (int s = 0; s < 100; ++s) {
    loss = m.forward(b);
    if (s == 0) first = loss;
    h.zero_grads();
    m.backward(1.0f, {});
    for (std::size_t i = 0; i < h.master.size(); ++i)
      for (std::size_t j = 0; j < h.master[i].size(); ++j) h.master[i][j] -= 0.5f * h.g32[i][j];
  }
  EXPECT_LT(loss, 0.2f * first);
  EXPECT_THROW({ ds::Batch bad = b; bad.feature_dim = 3; m.forward(bad); }, ds::Error);
}

// Scratch is sized at the first forward and reused: smaller and larger batches (the last
// partial micro-batch of an epoch, validation) give the same loss as a fresh model.
TEST(NnModels, ChangingBatchShapesReuseOrGrowScratch) {
  ds::nn::GptConfig cfg{2, 2, 16, 8, 32};
  ds::nn::Gpt m(cfg);
  Harness h(m, 9);
  TokenBatch big(4, 8, 32, 1), small(2, 5, 32, 2), bigger(6, 8, 32, 3);
  m.forward(big.batch);
  const float ls = m.forward(small.batch);
  m.backward(1.0f, {});
  const float lb = m.evaluate(bigger.batch);
  EXPECT_THROW(m.backward(1.0f, {}), ds::Error);  // evaluate keeps nothing for backward
  for (auto* tb : {&small, &bigger}) {
    ds::nn::Gpt fresh(cfg);
    Harness hf(fresh, 9);
    EXPECT_FLOAT_EQ(fresh.forward(tb->batch), tb == &small ? ls : lb);
  }
}

TEST(NnModels, Bf16GemmPrecisionCloseToFp32) {
  if (!ds::nn::bf16_gemm_supported()) GTEST_SKIP() << "no AVX512-BF16 on this CPU";
  ds::nn::GptConfig cfg{2, 2, 16, 8, 32};
  TokenBatch tb(3, 8, 32, 4);
  ds::nn::Gpt a(cfg), b(cfg);
  Harness ha(a, 5), hb(b, 5);
  b.set_gemm_precision(ds::nn::Precision::BF16);
  const float la = a.forward(tb.batch), lb = b.forward(tb.batch);
  EXPECT_NEAR(lb, la, 1e-2f * la);
  a.backward(1.0f, {});
  b.backward(1.0f, {});
  for (std::size_t i = 0; i < ha.infos.size(); ++i) {
    auto ga = ha.grad(i), gb = hb.grad(i);
    double dot = 0, na = 0, nb = 0;
    for (std::size_t j = 0; j < ga.size(); ++j) { dot += double(ga[j]) * gb[j]; na += double(ga[j]) * ga[j]; nb += double(gb[j]) * gb[j]; }
    if (na > 0) {
      EXPECT_GT(dot / std::sqrt(na * nb + 1e-30), 0.98) << ha.infos[i].name;
    }
  }
}

// --cpu_bf16_gemm=VALUE on this binary's command line: the kernels.cpu_bf16_gemm value main()
// applies before the tests (ctest runs the model tests with none, on, off and a bad value).
std::string g_cpu_bf16_gemm;

// The Linear GEMM precision follows the working dtype, the CPU and kernels.cpu_bf16_gemm;
// set_gemm_precision overrides it.
TEST(NnModels, LayerPrecisionFollowsDtypeCpuAndKey) {
  using ds::nn::Precision;
  const std::string mode = g_cpu_bf16_gemm;
  if (mode != "" && mode != "on" && mode != "off" && mode != "auto") {
    try {
      (void)ds::nn::parse_cpu_bf16_gemm(mode, "kernels.cpu_bf16_gemm");
      ADD_FAILURE() << "'" << mode << "' accepted";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find("kernels.cpu_bf16_gemm: '" + mode + "' is not one of auto, on, off"),
                std::string::npos) << e.what();
    }
    EXPECT_EQ(ds::nn::layer_precision(false), Precision::F32);
    return;
  }
  Precision want = Precision::F32;
  if (ds::nn::bf16_gemm_supported())
    want = mode == "on" ? Precision::BF16 : mode == "off" ? Precision::F32
                                                          : (ds::nn::measure_bf16_gemm().faster ? Precision::BF16 : Precision::F32);
  EXPECT_EQ(ds::nn::layer_precision(true), want);
  EXPECT_EQ(ds::nn::layer_precision(false), Precision::F32);
  for (ds::DType dt : {ds::DType::F32, ds::DType::F16, ds::DType::BF16}) {
    ds::nn::Gpt m(tiny_gpt());
    Harness h(m, 3, dt);
    EXPECT_EQ(m.gemm_precision(), dt == ds::DType::BF16 ? want : Precision::F32) << ds::dtype_name(dt);
  }
  ds::nn::Gpt fixed(tiny_gpt());
  fixed.set_gemm_precision(Precision::F32);
  Harness hf(fixed, 3, ds::DType::BF16);
  EXPECT_EQ(fixed.gemm_precision(), Precision::F32);
}

// kernels.cpu_bf16_gemm "auto" is the measured rule: bf16 when its kernel ran at least
// kBf16GemmMinSpeedup times faster than the fp32 one, measured once per process.
TEST(NnModels, CpuBf16GemmAutoIsTheMeasuredRule) {
  using ds::nn::CpuBf16Gemm;
  const ds::nn::Bf16GemmTiming& t = ds::nn::measure_bf16_gemm();
  EXPECT_EQ(&ds::nn::measure_bf16_gemm(), &t);
  EXPECT_EQ(ds::nn::cpu_bf16_gemm_choice(CpuBf16Gemm::Auto), t.faster);
  EXPECT_FALSE(ds::nn::cpu_bf16_gemm_choice(CpuBf16Gemm::Off));
  EXPECT_EQ(ds::nn::cpu_bf16_gemm_choice(CpuBf16Gemm::On), ds::nn::bf16_gemm_supported());
  if (!ds::nn::bf16_gemm_supported() || !ds::nn::f32_gemm_supported()) {
    EXPECT_FALSE(t.faster);
    return;
  }
  EXPECT_GT(t.f32_seconds, 0.0);
  EXPECT_GT(t.bf16_seconds, 0.0);
  EXPECT_EQ(t.faster, t.bf16_seconds * ds::nn::kBf16GemmMinSpeedup <= t.f32_seconds);
  std::printf("bf16 GEMM %.1f us, fp32 %.1f us (%.2fx): %s\n", t.bf16_seconds * 1e6, t.f32_seconds * 1e6,
              t.f32_seconds / t.bf16_seconds, t.faster ? "bf16" : "fp32");
}

TEST(NnModels, BadInputsGiveClearErrors) {
  ds::nn::Gpt m(tiny_gpt());
  EXPECT_THROW(ds::nn::Gpt({2, 3, 10, 7, 11}), ds::Error);  // 10 % 3 != 0
  Harness h(m, 1);
  TokenBatch tb(1, 8, 11, 1);  // seq 8 > block_size 7
  EXPECT_THROW(m.forward(tb.batch), ds::Error);
  TokenBatch ok(1, 4, 11, 1);
  ok.in[2] = 11;  // out of vocab
  EXPECT_THROW(m.forward(ok.batch), ds::Error);
}

}  // namespace

// ParamSet in a half working dtype: prepare_forward converts every parameter (spread over
// threads in 64 Ki-element pieces that cross parameter boundaries), prepare_backward zeroes
// only the non-direct shadows.
TEST(NnModels, ParamSetHalfShadows) {
  ds::nn::ParamSet ps;
  const std::vector<std::int64_t> sizes = {100000, 3, 0, 70001, 131072, 5};
  for (std::size_t i = 0; i < sizes.size(); ++i) ps.add(std::string(1, 'p').append(std::to_string(i)), {sizes[i]});
  std::vector<std::vector<std::uint16_t>> p16(sizes.size()), g16(sizes.size());
  std::vector<ds::TensorView> pv, gv;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    p16[i].resize(std::size_t(sizes[i]) + 1);  // never empty: views need a pointer
    g16[i].resize(std::size_t(sizes[i]) + 1);
    for (std::size_t j = 0; j < p16[i].size(); ++j) p16[i][j] = ds::float_to_bf16(float(i) + 1e-3f * float(j % 997)).bits;
    pv.push_back({p16[i].data(), std::size_t(sizes[i]), ds::DType::BF16});
    gv.push_back({g16[i].data(), std::size_t(sizes[i]), ds::DType::BF16});
  }
  ps.bind(pv, gv);
  ps.prepare_forward();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (std::int64_t j = 0; j < sizes[i]; ++j)
      ASSERT_EQ(ps.w(i)[j], ds::bf16_to_float(ds::bf16{p16[i][std::size_t(j)]})) << "param " << i << " element " << j;
  for (std::size_t i = 0; i < sizes.size(); ++i) std::fill(ps.g(i), ps.g(i) + sizes[i], 7.0f);
  ps.set_direct_grad(3, true);
  ps.set_direct_grad(5, true);
  ps.prepare_backward();
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (std::int64_t j = 0; j < sizes[i]; ++j)
      ASSERT_EQ(ps.g(i)[j], ps.direct_grad(i) ? 7.0f : 0.0f) << "param " << i << " element " << j;
  EXPECT_TRUE(ps.direct_grad(3));
  EXPECT_FALSE(ps.direct_grad(4));
}

// Applies --cpu_bf16_gemm=on|off|auto (see g_cpu_bf16_gemm) as the train app applies the
// agreed choice; a value that does not parse is left for the test above to check.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const std::string flag = "--cpu_bf16_gemm=";
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]).rfind(flag, 0) == 0) g_cpu_bf16_gemm = std::string(argv[i]).substr(flag.size());
  if (g_cpu_bf16_gemm == "on" || g_cpu_bf16_gemm == "off" || g_cpu_bf16_gemm == "auto")
    ds::nn::set_cpu_bf16_gemm(ds::nn::cpu_bf16_gemm_choice(
        ds::nn::parse_cpu_bf16_gemm(g_cpu_bf16_gemm, "--cpu_bf16_gemm")));
  return RUN_ALL_TESTS();
}

// Module::init_parameter_range (ZeRO-3 initialises a group at a time with it): every range of
// the GPT's and the Llama's parameters gets exactly the values the whole-model init gives.
namespace {
template <class M>
void expect_ranges_equal_whole(M& m) {
  const auto infos = m.parameters();
  auto spans_of = [&](std::vector<std::vector<float>>& v, std::size_t a, std::size_t b) {
    std::vector<std::span<float>> s;
    for (std::size_t i = a; i < b; ++i) s.emplace_back(v[i]);
    return s;
  };
  std::vector<std::vector<float>> whole, ranged;
  for (const auto& p : infos) {
    whole.emplace_back(std::size_t(p.numel()), -7.0f);
    ranged.emplace_back(std::size_t(p.numel()), -7.0f);
  }
  m.init_parameters(spans_of(whole, 0, infos.size()), 99);
  for (std::size_t a = 0, k = 1; a < infos.size(); a += k, k++) {  // ranges of 1, 2, 3, ... tensors
    const std::size_t b = std::min(infos.size(), a + k);
    ASSERT_TRUE(m.init_parameter_range(a, spans_of(ranged, a, b), 99));
  }
  for (std::size_t i = 0; i < infos.size(); ++i) EXPECT_EQ(whole[i], ranged[i]) << infos[i].name;
  EXPECT_THROW(m.init_parameter_range(infos.size(), spans_of(ranged, 0, 1), 99), ds::Error);
}
}  // namespace

TEST(NnModels, InitParameterRangeEqualsWholeInit) {
  ds::nn::Gpt gpt(tiny_gpt());
  expect_ranges_equal_whole(gpt);
  ds::nn::LlamaConfig lc;
  lc.n_layer = 2;
  lc.n_head = 4;
  lc.n_kv_head = 2;
  lc.n_embd = 16;
  lc.intermediate_size = 24;
  lc.vocab_size = 13;
  lc.block_size = 8;
  ds::nn::Llama llama(lc);
  expect_ranges_equal_whole(llama);
}
