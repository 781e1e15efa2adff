// Test helpers for the ZeRO-3 group brackets (ds/core/module.h): hooks that poison every group
// outside its brackets, and a fixed sequence of model calls whose results two runs compare
// bit for bit (test_group_hooks.cpp, test_activation_checkpointing.cpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/module.h"
#include "model_harness.h"
#include "same_bits.h"

namespace dstest {

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
    int held = 0;
    for (int n : open_) held += n > 0;
    max_held_ = std::max(max_held_, held);
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
    for (std::size_t g = 0; g < groups_.size(); ++g)
      EXPECT_TRUE(seen_.count({g, pass_})) << what << ": group " << groups_[g].name << " never acquired";
    check_brackets(what);
  }
  // After a call that uses some groups only (a range of layers): every bracket closed, no
  // contract broken.
  void check_brackets(const std::string& what) {
    for (std::size_t g = 0; g < groups_.size(); ++g)
      EXPECT_EQ(open_[g], 0) << what << ": group " << groups_[g].name << " left acquired";
    EXPECT_EQ(errors_, "") << what;
    errors_.clear();
  }
  // Whether group g was acquired in the current pass since begin().
  bool seen(std::size_t g) const { return seen_.count({g, pass_}) > 0; }
  // grad_ready(i) must come while i's group is acquired (its gradient is being reduced).
  void ready(std::size_t i) {
    if (i >= group_of_.size() || open_[group_of_[i]] == 0)
      errors_ += "grad_ready(" + std::to_string(i) + ") outside its group's bracket\n";
  }
  // The most groups acquired at once so far.
  int max_held() const { return max_held_; }
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
  int max_held_ = 0;
};

struct Data {
  std::vector<std::int32_t> in, tg;
  std::vector<float> feat;
  ds::Batch batch;
};

inline Data tokens(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t seed) {
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

inline Data features(std::int64_t B, std::int64_t F, std::int64_t K, std::uint64_t seed) {
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
  int max_held = 0;              // hooked: the most groups acquired at once
  std::size_t shadow_bytes = 0;  // the model's fp32 shadows at the end (hooks still set)
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
  if constexpr (requires { m.shadow_bytes(); }) r.shadow_bytes = m.shadow_bytes();
  if (hooks) {
    r.max_held = hooks->max_held();
    hooks->restore_all();
    m.set_group_hooks(nullptr);
  }
  for (std::size_t i = 0; i < h.infos.size(); ++i) r.grads.push_back(h.grad(i));
  return r;
}

inline void expect_same(const Result& x, const Result& y, const std::string& what) {
  EXPECT_EQ(ds::test::first_bit_difference(x.losses, y.losses), "") << what << ": losses";
  ASSERT_EQ(x.grads.size(), y.grads.size());
  for (std::size_t i = 0; i < x.grads.size(); ++i)
    EXPECT_EQ(ds::test::first_bit_difference(x.grads[i], y.grads[i]), "") << what << ": gradient " << i;
  EXPECT_EQ(x.ready, y.ready) << what;
  EXPECT_EQ(x.sampled, y.sampled) << what;
  for (const auto& g : x.grads)
    for (float v : g) ASSERT_TRUE(std::isfinite(v)) << what;
}

// The same calls on two models built from cfg, set up by setup_a / setup_b (e.g. activation
// checkpointing on), the second with poisoning hooks when hooked_b: the same bits.
template <class M, class Cfg, class SetupA, class SetupB>
void expect_same_runs(const Cfg& cfg, ds::DType dt, const Data& a, const Data& b, bool token_model, SetupA setup_a,
                      SetupB setup_b, bool hooked_b, const std::string& what) {
  M ma(cfg), mb(cfg);
  setup_a(ma);
  setup_b(mb);
  Harness ha(ma, 5, dt), hb(mb, 5, dt);
  const Result x = run(ma, ha, false, a, b, token_model);
  const Result y = run(mb, hb, hooked_b, a, b, token_model);
  expect_same(x, y, what);
}

template <class M, class Cfg>
void same_bits_with_poisoning_hooks(const Cfg& cfg, ds::DType dt, const Data& a, const Data& b, bool token_model,
                                    const std::string& what) {
  auto none = [](M&) {};
  expect_same_runs<M>(cfg, dt, a, b, token_model, none, none, true, what);
}

inline const char* dt_name(ds::DType dt) { return dt == ds::DType::F32 ? "fp32" : dt == ds::DType::BF16 ? "bf16" : "fp16"; }

}  // namespace dstest
