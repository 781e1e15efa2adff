// The ZeRO-3 parameter groups of the built-in models (ds/core/module.h): the groups tile
// parameters() in order, and every use of a parameter or gradient is inside its group's
// bracket. The proof: hooks that overwrite a group's parameters and gradients with NaN
// whenever none of its brackets is open (and put the values back on acquire) leave the losses,
// gradients, grad_ready order and sampled tokens bit-identical to a run without hooks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/nn/mlp.h"
#include "poison_hooks.h"
#include "small_decoders.h"

namespace {

using namespace dstest;

// Groups non-empty, consecutive, covering parameters() in order, named as expected.
void expect_tiling(const ds::Module& m, const std::vector<std::string>& names) {
  const auto groups = m.parameter_groups();
  const std::size_t n = m.parameters().size();
  ASSERT_EQ(groups.size(), names.size());
  std::size_t next = 0;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    EXPECT_EQ(groups[g].name, names[g]);
    EXPECT_EQ(groups[g].first, next) << groups[g].name;
    EXPECT_GT(groups[g].count, 0u) << groups[g].name;
    next = groups[g].first + groups[g].count;
  }
  EXPECT_EQ(next, n);
}

std::vector<std::string> decoder_groups(int layers) {
  std::vector<std::string> out{"embed"};
  for (int l = 0; l < layers; ++l) out.push_back("h." + std::to_string(l));
  out.push_back("final");
  return out;
}

TEST(NnGroupHooks, GroupsTileParametersInOrder) {
  expect_tiling(ds::nn::Gpt(gpt_cfg()), decoder_groups(3));
  expect_tiling(ds::nn::Llama(llama_cfg(true)), decoder_groups(3));
  expect_tiling(ds::nn::Llama(llama_cfg(false)), decoder_groups(3));
  EXPECT_EQ(ds::nn::Llama(llama_cfg(false)).parameter_groups().back().count, 2u);  // norm + lm_head
  ds::nn::MlpConfig mc;
  mc.n_hidden_layers = 2;
  expect_tiling(ds::nn::Mlp(mc), {"fc.0", "fc.1", "head"});
  mc.n_hidden_layers = 0;
  expect_tiling(ds::nn::Mlp(mc), {"head"});
}

// Both backward paths of the GPT: the per-thread split with partials (2 threads, batch 3) and
// one thread (with bf16, the Linear gradients go straight into the bound 16-bit gradients).
TEST(NnGroupHooks, GptSameBitsWithPoisoningHooks) {
  const auto cfg = gpt_cfg();
  const Data a = tokens(3, 8, cfg.vocab_size, 1), b = tokens(3, 5, cfg.vocab_size, 2);
  for (int threads : {1, 2})
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16, ds::DType::F16})
      ds::test::on_threads(threads, [&] {
        same_bits_with_poisoning_hooks<ds::nn::Gpt>(cfg, dt, a, b, true,
                                                    std::string("gpt ") + dt_name(dt) + " threads " + std::to_string(threads));
        return 0;
      });
}

TEST(NnGroupHooks, LlamaSameBitsWithPoisoningHooks) {
  for (bool tie : {true, false}) {
    const auto cfg = llama_cfg(tie);
    const Data a = tokens(2, 8, cfg.vocab_size, 3), b = tokens(2, 6, cfg.vocab_size, 4);
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16, ds::DType::F16})
      same_bits_with_poisoning_hooks<ds::nn::Llama>(cfg, dt, a, b, true,
                                                    std::string("llama ") + (tie ? "tied " : "untied ") + dt_name(dt));
  }
}

TEST(NnGroupHooks, MlpSameBitsWithPoisoningHooks) {
  ds::nn::MlpConfig cfg;
  cfg.in_features = 6;
  cfg.hidden = 10;
  cfg.n_classes = 3;
  cfg.n_hidden_layers = 2;
  const Data a = features(5, 6, 3, 5), b = features(4, 6, 3, 6);
  for (ds::DType dt : {ds::DType::F32, ds::DType::BF16, ds::DType::F16})
    same_bits_with_poisoning_hooks<ds::nn::Mlp>(cfg, dt, a, b, false, std::string("mlp ") + dt_name(dt));
}

// Half dtypes compute on fp32 shadows of the parameters and gradients. With group hooks they
// hold the groups in use, not the model: at most one group-sized slot per group acquired at
// once, plus one for the tied embedding, whose gradient stays open from the LM head at the
// start of backward to the embedding at its end. Without hooks: the whole model, 8 bytes a
// parameter. Same bits either way (the calls of run()).
template <class M, class Cfg>
void expect_shadows_of_groups_in_use(const Cfg& cfg, const std::string& what) {
  const Data a = tokens(2, 8, cfg.vocab_size, 7), b = tokens(2, 6, cfg.vocab_size, 8);
  M ma(cfg), mb(cfg);
  Harness ha(ma, 5, ds::DType::BF16), hb(mb, 5, ds::DType::BF16);
  const Result x = run(ma, ha, false, a, b, true);
  const Result y = run(mb, hb, true, a, b, true);
  expect_same(x, y, what);
  const auto infos = ma.parameters();
  std::size_t total = 0, largest = 0;
  for (const auto& p : infos) total += p.numel();
  for (const auto& grp : ma.parameter_groups()) {
    std::size_t n = 0;
    for (std::size_t i = grp.first; i < grp.first + grp.count; ++i) n += infos[i].numel();
    largest = std::max(largest, n);
  }
  EXPECT_EQ(x.shadow_bytes, 8 * total) << what;
  ASSERT_GT(y.max_held, 0) << what;
  EXPECT_LE(y.shadow_bytes, 8 * largest * std::size_t(y.max_held + 1)) << what << ": largest group " << largest
                                                                        << ", held at once " << y.max_held;
  EXPECT_LT(3 * y.shadow_bytes, x.shadow_bytes) << what;
  EXPECT_EQ(mb.shadow_bytes(), 0u) << what << ": hooks unset, no shadow until the next forward";
}

TEST(NnGroupHooks, HalfShadowsHoldOnlyTheGroupsInUse) {
  ds::nn::GptConfig gc = gpt_cfg();
  gc.n_layer = 8;
  for (int threads : {1, 2})
    ds::test::on_threads(threads, [&] {
      expect_shadows_of_groups_in_use<ds::nn::Gpt>(gc, "gpt threads " + std::to_string(threads));
      return 0;
    });
  for (bool tie : {true, false}) {
    ds::nn::LlamaConfig lc = llama_cfg(tie);
    lc.n_layer = 8;
    expect_shadows_of_groups_in_use<ds::nn::Llama>(lc, std::string("llama ") + (tie ? "tied" : "untied"));
  }
}

}  // namespace
