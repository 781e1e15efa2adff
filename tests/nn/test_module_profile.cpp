// The flops profiler's module trees of the built-in models (ds/nn/module_trees.h): each
// module's parameters and forward MACs against hand-computed values, the totals against the
// models' analytic FLOPs per token, the ops' times landing in their modules only while a
// profile is set.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ds/core/module_profile.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/nn/mlp.h"
#include "ds/nn/model_factory.h"
#include "model_harness.h"

namespace {

struct Row {
  int depth = 0;
  std::string type;
  std::int64_t params = 0;
  double macs = 0, seconds = 0;
};

// Name -> the module's totals (own plus its children's).
std::map<std::string, Row> by_name(const ds::ModuleProfile& p) {
  const auto t = p.totals();
  std::map<std::string, Row> out;
  for (std::size_t i = 0; i < p.modules().size(); ++i) {
    const ds::ModuleStats& m = p.modules()[i];
    out[m.name] = {m.depth, m.type, t[i].params, t[i].macs, t[i].seconds};
  }
  return out;
}

// One forward of `b` with the profile set.
void profiled_forward(ds::Module& m, ds::ModuleProfile& p, const ds::Batch& b) {
  ASSERT_TRUE(m.set_module_profile(&p));
  m.forward(b);
  m.set_module_profile(nullptr);
}

void profiled_forward(ds::Module& m, ds::ModuleProfile& p, std::int64_t B, std::int64_t T, std::int64_t vocab) {
  profiled_forward(m, p, dstest::TokenBatch(B, T, vocab, 7).batch);
}

TEST(ModuleProfile, GptModulesParamsAndMacsByHand) {
  ds::nn::Gpt m({2, 2, 8, 8, 16});  // n_layer, n_head, n_embd C = 8, block_size 8, vocab V = 16
  dstest::Harness h(m, 1);
  ds::ModuleProfile p;
  profiled_forward(m, p, 2, 4, 16);  // N = B x T = 8 tokens
  const auto r = by_name(p);
  ASSERT_EQ(r.size(), 1u + 3 + 2 * 9 + 2);  // model; wte, wpe, h; 9 per block; ln_f, lm_head
  EXPECT_EQ(r.at("").type, "Gpt");
  EXPECT_EQ(r.at("h.1.attn.c_attn").depth, 4);
  EXPECT_EQ(r.at("h.1.attn.c_attn").type, "Linear");
  EXPECT_EQ(r.at("h.0").type, "Block");
  EXPECT_EQ(r.at("").params, std::int64_t(m.num_parameters()));
  EXPECT_EQ(r.at("wte").params, 16 * 8);
  EXPECT_EQ(r.at("wpe").params, 8 * 8);
  EXPECT_EQ(r.at("h.0.attn.c_attn").params, 24 * 8 + 24);
  EXPECT_EQ(r.at("h.0.ln_1").params, 16);
  EXPECT_EQ(r.at("lm_head").params, 0);  // tied: counted in wte
  // MACs: c_attn N*C*3C, the score products 2*B*T*T*C, c_proj N*C*C, c_fc and mlp.c_proj N*C*4C, head N*C*V.
  EXPECT_EQ(r.at("h.0.attn.c_attn").macs, 8 * 8 * 24);
  EXPECT_EQ(r.at("h.0.attn").macs, 8 * 8 * 24 + 2 * 2 * 4 * 4 * 8 + 8 * 8 * 8);
  EXPECT_EQ(r.at("h.0.mlp").macs, 2 * 8 * 8 * 32);
  EXPECT_EQ(r.at("lm_head").macs, 8 * 8 * 16);
  EXPECT_EQ(r.at("").macs, 2 * (1536 + 512 + 512 + 2048 + 2048) + 1024);
  EXPECT_EQ(2 * r.at("").macs, 8 * m.flops_per_token(4) / 3);
  // Every op's module got time; the loss went to the model's own.
  for (const char* name : {"wte", "h.0.ln_1", "h.0.attn.c_attn", "h.1.attn", "h.1.mlp.c_proj", "ln_f", "lm_head"})
    EXPECT_GT(r.at(name).seconds, 0) << name;
  EXPECT_EQ(r.at("wpe").seconds, 0);  // one kernel adds both tables: its time is wte's
  EXPECT_GT(p.modules()[0].seconds, 0);
}

TEST(ModuleProfile, LlamaModulesParamsAndMacsByHand) {
  ds::nn::LlamaConfig c;
  c.n_layer = 1;
  c.n_head = 4;
  c.n_kv_head = 2;  // head dim 4: k and v are 8 wide
  c.n_embd = 16;
  c.intermediate_size = 24;
  c.block_size = 8;
  c.vocab_size = 32;
  ds::nn::Llama m(c);
  dstest::Harness h(m, 1);
  ds::ModuleProfile p;
  profiled_forward(m, p, 1, 8, 32);  // N = 8 tokens
  const auto r = by_name(p);
  EXPECT_EQ(r.at("").type, "LlamaForCausalLM");
  EXPECT_EQ(r.at("model.layers.0.self_attn.k_proj").depth, 5);
  EXPECT_EQ(r.at("").params, std::int64_t(m.num_parameters()));
  EXPECT_EQ(r.at("model.layers.0.self_attn.k_proj").params, 8 * 16);
  EXPECT_EQ(r.at("model.layers.0.mlp").params, 3 * 16 * 24);
  EXPECT_EQ(r.at("lm_head").params, 32 * 16);
  EXPECT_EQ(r.at("model.layers.0.self_attn.q_proj").macs, 8 * 16 * 16);
  EXPECT_EQ(r.at("model.layers.0.self_attn.v_proj").macs, 8 * 16 * 8);
  EXPECT_EQ(r.at("model.layers.0.self_attn").macs, 2048 + 1024 + 1024 + 2 * 8 * 8 * 16 + 2048);
  EXPECT_EQ(r.at("model.layers.0.mlp.down_proj").macs, 8 * 24 * 16);
  EXPECT_EQ(r.at("").macs, 21504);
  EXPECT_EQ(2 * r.at("").macs, 8 * m.flops_per_token(8) / 3);
  for (const char* name : {"model.embed_tokens", "model.layers.0.input_layernorm", "model.layers.0.self_attn",
                           "model.layers.0.mlp.gate_proj", "model.norm", "lm_head"})
    EXPECT_GT(r.at(name).seconds, 0) << name;
}

TEST(ModuleProfile, MlpModulesParamsAndMacsByHand) {
  ds::nn::Mlp m({12, 5, 3, 2});  // in 12, hidden 5, classes 3, 2 hidden layers
  dstest::Harness h(m, 1);
  std::vector<float> x(4 * 12, 0.5f);
  std::vector<std::int32_t> y = {0, 1, 2, 0};
  ds::Batch b;
  b.features = x;
  b.targets = y;
  b.batch = 4;
  b.feature_dim = 12;
  ds::ModuleProfile p;
  profiled_forward(m, p, b);
  const auto r = by_name(p);
  EXPECT_EQ(r.at("fc.0").params, 12 * 5 + 5);
  EXPECT_EQ(r.at("fc").params, 12 * 5 + 5 + 5 * 5 + 5);
  EXPECT_EQ(r.at("fc.1").macs, 4 * 5 * 5);
  EXPECT_EQ(r.at("head").macs, 4 * 5 * 3);
  EXPECT_EQ(r.at("").macs, 240 + 100 + 60);
  EXPECT_EQ(2 * r.at("").macs, 4 * m.flops_per_sample() / 3);
  EXPECT_GT(r.at("head").seconds, 0);
}

// The profile fills only while set; setting it again starts a fresh tree.
TEST(ModuleProfile, OnlyWhileSet) {
  ds::nn::Gpt m({1, 2, 8, 8, 16});
  dstest::Harness h(m, 1);
  ds::ModuleProfile p;
  profiled_forward(m, p, 1, 8, 16);
  const double macs = p.totals()[0].macs, seconds = p.totals()[0].seconds;
  m.forward(dstest::TokenBatch(1, 8, 16, 3).batch);  // not set: nothing added
  EXPECT_EQ(p.totals()[0].macs, macs);
  EXPECT_EQ(p.totals()[0].seconds, seconds);
  ASSERT_TRUE(m.set_module_profile(&p));
  EXPECT_EQ(p.totals()[0].macs, 0);
  m.set_module_profile(nullptr);
}

// What make_model hands the train app: the tree's forward FLOPs are a third of its FLOPs per token.
TEST(ModuleProfile, TotalsAgreeWithTheFactorysFlopsPerToken) {
  for (const char* type : {"gpt", "llama", "mlp"}) {
    ds::nn::ModelSpec s;
    s.type = type;
    s.n_layer = 2;
    s.n_kv_head = s.n_head = 2;
    s.n_embd = 16;
    s.block_size = 8;
    s.vocab_size = 12;
    ds::nn::BuiltModel built = ds::nn::make_model(s, false, 0, {}, {});
    dstest::Harness h(*built.module, 3);
    const dstest::TokenBatch tokens(3, 8, 12, 5);
    ds::ModuleProfile p;
    profiled_forward(*built.module, p, built.adapt_batch ? built.adapt_batch(tokens.batch) : tokens.batch);
    EXPECT_NEAR(2 * p.totals()[0].macs, 3 * 8 * built.flops_per_token / 3, 1e-6 * p.totals()[0].macs) << type;
  }
}

}  // namespace
