// The ZeRO-3 parameter groups of the built-in models (ds/core/module.h): the groups tile
// parameters() in order, and every use of a parameter or gradient is inside its group's
// bracket. The proof: hooks that overwrite a group's parameters and gradients with NaN
// whenever none of its brackets is open (and put the values back on acquire) leave the losses,
// gradients, grad_ready order and sampled tokens bit-identical to a run without hooks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/module.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/nn/mlp.h"
#include "model_harness.h"
#include "same_bits.h"

namespace {

using dstest::Harness;
using ds::Pass;

// Poisons group g's parameter and gradient storage (the harness's, as the engine's would be
// released) when its last open bracket closes; restores it on the next acquire. Records what
// the contract forbids: unbalanced releases, the wrong pass, grad_ready outside a bracket.
class PoisonHooks : public ds::GroupHooks {
 public:
  PoisonHooks(Harness& h, std::vector<ds::ParamGroup> groups)
      : h_(h), groups_(std::move(groups)), open_(groups_.size(), 0), saved_(h.infos.size()) {
    for (std::size_t g = 0; g < groups_.size(); ++g)
      for (std::size_t i = groups_[g].first; i < groups_[g].first + groups_[g].count; ++i) group_of_.push_back(g);
    for (std::size_t g = 0; g < groups_.size(); ++g) poison(g);
  }
  void acquire(std::size_t g, Pass pass) override {
    if (g >= groups_.size()) { errors_ += "acquire of group " + std::to_string(g) + " out of range\n"; return; }
    if (pass != pass_) errors_ += "group " + groups_[g].name + " acquired in the wrong pass\n";
    seen_.insert({g, pass});
    if (open_[g]++ == 0) restore(g);
  }
  void release(std::size_t g, Pass pass) noexcept override {
    if (g >= groups_.size() || open_[g] == 0) { errors_ += "release without acquire\n"; return; }
    if (pass != pass_) errors_ += "group " + groups_[g].name + " released in the wrong pass\n";
    if (--open_[g] == 0) poison(g);
  }
  // The pass the next calls run in; forgets which groups were seen.
  void begin(Pass pass) {
    pass_ = pass;
    seen_.clear();
  }
  // After a call: every bracket closed, every group acquired in `pass`.
  void check_call(const std::string& what) {
    for (std::size_t g = 0; g < groups_.size(); ++g) {
      EXPECT_EQ(open_[g], 0) << what << ": group " << groups_[g].name << " left acquired";
      EXPECT_TRUE(seen_.count({g, pass_})) << what << ": group " << groups_[g].name << " never acquired";
    }
    EXPECT_EQ(errors_, "") << what;
    errors_.clear();
  }
  // grad_ready(i) must come while i's group is acquired (its gradient is being reduced).
  void ready(std::size_t i) {
    if (i >= group_of_.size() || open_[group_of_[i]] == 0)
      errors_ += "grad_ready(" + std::to_string(i) + ") outside its group's bracket\n";
  }
  void restore_all() {
    for (std::size_t g = 0; g < groups_.size(); ++g) restore(g);
  }

 private:
  // Parameter i's parameter and gradient storage as bytes.
  std::pair<std::span<std::byte>, std::span<std::byte>> bytes(std::size_t i) {
    if (h_.dt == ds::DType::F32)
      return {std::as_writable_bytes(std::span(h_.master[i])), std::as_writable_bytes(std::span(h_.g32[i]))};
    return {std::as_writable_bytes(std::span(h_.p16[i])), std::as_writable_bytes(std::span(h_.g16[i]))};
  }
  void fill_nan(std::span<std::byte> b) {
    if (h_.dt == ds::DType::F32) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (std::size_t k = 0; k + 4 <= b.size(); k += 4) std::memcpy(b.data() + k, &nan, 4);
    } else {
      const std::uint16_t nan = h_.dt == ds::DType::BF16 ? 0x7FC0 : 0x7E00;
      for (std::size_t k = 0; k + 2 <= b.size(); k += 2) std::memcpy(b.data() + k, &nan, 2);
    }
  }
  void poison(std::size_t g) {
    for (std::size_t i = groups_[g].first; i < groups_[g].first + groups_[g].count; ++i) {
      auto [p, gr] = bytes(i);
      saved_[i].assign(p.begin(), p.end());
      saved_[i].insert(saved_[i].end(), gr.begin(), gr.end());
      fill_nan(p);
      fill_nan(gr);
    }
  }
  void restore(std::size_t g) {
    for (std::size_t i = groups_[g].first; i < groups_[g].first + groups_[g].count; ++i) {
      auto [p, gr] = bytes(i);
      if (saved_[i].size() != p.size() + gr.size()) continue;  // never poisoned
      std::memcpy(p.data(), saved_[i].data(), p.size());
      std::memcpy(gr.data(), saved_[i].data() + p.size(), gr.size());
      saved_[i].clear();
    }
  }

  Harness& h_;
  std::vector<ds::ParamGroup> groups_;
  std::vector<std::size_t> group_of_;
  std::vector<int> open_;
  std::vector<std::vector<std::byte>> saved_;
  std::set<std::pair<std::size_t, Pass>> seen_;
  Pass pass_ = Pass::Forward;
  std::string errors_;
};

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

struct Data {
  std::vector<std::int32_t> in, tg;
  std::vector<float> feat;
  ds::Batch batch;
};

Data tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t seed) {
  Data d;
  std::mt19937_64 g(seed);
  d.in.resize(std::size_t(B * T));
  d.tg.resize(d.in.size());
  for (auto& x : d.in) x = std::int32_t(g() % std::uint64_t(V));
  for (auto& x : d.tg) x = std::int32_t(g() % std::uint64_t(V));
  d.batch.inputs = d.in;
  d.batch.targets = d.tg;
  d.batch.batch = B;
  d.batch.seq = T;
  return d;
}

Data features(std::int64_t B, std::int64_t F, std::int64_t K, std::uint64_t seed) {
  Data d;
  std::mt19937_64 g(seed);
  std::normal_distribution<float> n(0.0f, 1.0f);
  d.feat.resize(std::size_t(B * F));
  for (auto& x : d.feat) x = n(g);
  d.tg.resize(std::size_t(B));
  for (auto& x : d.tg) x = std::int32_t(g() % std::uint64_t(K));
  d.batch.features = d.feat;
  d.batch.targets = d.tg;
  d.batch.batch = B;
  d.batch.feature_dim = F;
  return d;
}

struct Result {
  std::vector<float> losses;  // forward, forward, evaluate, then the logits of logits_last
  std::vector<std::vector<float>> grads;
  std::vector<std::size_t> ready;
  std::vector<std::int32_t> sampled;
};

// Two accumulating forward/backward micro-batches, an evaluate, and for token models
// logits_last and generate; with poisoning hooks when `hooked`.
template <class M>
Result run(M& m, Harness& h, bool hooked, const Data& a, const Data& b, bool token_model) {
  std::unique_ptr<PoisonHooks> hooks;
  if (hooked) {
    hooks = std::make_unique<PoisonHooks>(h, m.parameter_groups());
    m.set_group_hooks(hooks.get());
  }
  auto begin = [&](Pass p) { if (hooks) hooks->begin(p); };
  auto check = [&](const char* what) { if (hooks) hooks->check_call(what); };
  Result r;
  auto ready = [&](std::size_t i) {
    if (hooks) hooks->ready(i);
    r.ready.push_back(i);
  };
  for (const Data* d : {&a, &b}) {
    begin(Pass::Forward);
    r.losses.push_back(m.forward(d->batch));
    check("forward");
    begin(Pass::Backward);
    m.backward(d == &a ? 1.0f : 0.5f, ready);
    check("backward");
  }
  begin(Pass::Forward);
  r.losses.push_back(m.evaluate(b.batch));
  check("evaluate");
  if constexpr (requires { m.generate(std::span<const std::int32_t>{}, 1, 1.0f, 1); }) {
    if (token_model) {
      begin(Pass::Forward);
      const auto l = m.logits_last(a.in);
      r.losses.insert(r.losses.end(), l.begin(), l.end());
      check("logits_last");
      begin(Pass::Forward);
      r.sampled = m.generate(std::span(a.in).first(3), 4, 1.0f, 11);
      check("generate");
    }
  }
  if (hooks) {
    hooks->restore_all();
    m.set_group_hooks(nullptr);
  }
  for (std::size_t i = 0; i < h.infos.size(); ++i) r.grads.push_back(h.grad(i));
  return r;
}

void expect_same(const Result& x, const Result& y, const std::string& what) {
  EXPECT_EQ(ds::test::first_bit_difference(x.losses, y.losses), "") << what << ": losses";
  ASSERT_EQ(x.grads.size(), y.grads.size());
  for (std::size_t i = 0; i < x.grads.size(); ++i)
    EXPECT_EQ(ds::test::first_bit_difference(x.grads[i], y.grads[i]), "") << what << ": gradient " << i;
  EXPECT_EQ(x.ready, y.ready) << what;
  EXPECT_EQ(x.sampled, y.sampled) << what;
  for (const auto& g : x.grads)
    for (float v : g) ASSERT_TRUE(std::isfinite(v)) << what;
}

template <class M, class Cfg>
void same_bits_with_poisoning_hooks(const Cfg& cfg, ds::DType dt, const Data& a, const Data& b, bool token_model,
                                    const std::string& what) {
  M plain(cfg), hooked(cfg);
  Harness hp(plain, 5, dt), hh(hooked, 5, dt);
  const Result x = run(plain, hp, false, a, b, token_model);
  const Result y = run(hooked, hh, true, a, b, token_model);
  expect_same(x, y, what);
}

const char* dt_name(ds::DType dt) { return dt == ds::DType::F32 ? "fp32" : dt == ds::DType::BF16 ? "bf16" : "fp16"; }

ds::nn::GptConfig gpt_cfg() { return {3, 2, 16, 8, 13}; }

ds::nn::LlamaConfig llama_cfg(bool tie) {
  ds::nn::LlamaConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.intermediate_size = 20;
  c.block_size = 8;
  c.vocab_size = 11;
  c.tie_embeddings = tie;
  return c;
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
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16})
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
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16})
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
  for (ds::DType dt : {ds::DType::F32, ds::DType::BF16})
    same_bits_with_poisoning_hooks<ds::nn::Mlp>(cfg, dt, a, b, false, std::string("mlp ") + dt_name(dt));
}

}  // namespace
