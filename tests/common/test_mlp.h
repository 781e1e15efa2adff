// The small MLP regression Module of the engine and checkpoint tests: fp32 math on any working
// dtype (fp32 / fp16 / bf16 parameters and gradients), gradients accumulated (+=) into the
// bound views as the Module contract requires, and fault injection (inf gradients, NaN loss).
//
// y = w2 . act(W1 x + b1) + b2 (+ the `extra` tensors); loss = mean over the batch of
// (y - t)^2 / 2. Parameters: <l1>.weight [H, D], <l1>.bias [H], <l2>.weight [1, H],
// <l2>.bias [1], then `extra` single-element tensors "extra.k" that add to y (tensors smaller
// than the world / a ZeRO partition). MlpStyle picks the activation, the layer names and the
// initial values, so each suite keeps the exact numbers its expectations were written for.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ds/core/module.h"
#include "elem.h"

namespace ds::test {

struct MlpStyle {
  enum class Act { Relu, Tanh };
  Act act = Act::Relu;
  const char* l1 = "fc1";
  const char* l2 = "fc2";
  // Initial values: multiples of 1/init_grid in [-0.5, 0.5) (exact in fp16 and bf16 too),
  // from an xorshift stream started at seed * golden + init_offset.
  std::uint64_t init_grid = 64;
  std::uint64_t init_offset = 1;
};

class TestMlp : public Module {
 public:
  enum class ReadyOrder { Reverse, Forward, Never, Twice };

  TestMlp(int d, int h, int extra = 0, MlpStyle style = {}) : d_(d), h_(h), extra_(extra), style_(style) {}

  std::set<int> inf_grad_on_backward;  // backward call indices (0-based) that write +inf
  std::set<int> nan_loss_on_forward;   // forward call indices that return NaN
  ReadyOrder order = ReadyOrder::Reverse;
  // ZeRO-3: declare two parameter groups ("l1": fc1.*, "l2": fc2.* and the extras) and
  // bracket their uses; false: no groups (the engine brackets the whole model).
  bool grouped = false;
  GroupHooks* hooks = nullptr;

  std::vector<ParamGroup> parameter_groups() const override {
    if (!grouped) return {};
    return {ParamGroup{style_.l1, 0, 2}, ParamGroup{style_.l2, 2, 2 + std::size_t(extra_)}};
  }
  void set_group_hooks(GroupHooks* h) override { hooks = h; }

  std::vector<ParamInfo> parameters() const override {
    const std::string l1 = style_.l1, l2 = style_.l2;
    std::vector<ParamInfo> p{{l1 + ".weight", {h_, d_}}, {l1 + ".bias", {h_}}, {l2 + ".weight", {1, h_}}, {l2 + ".bias", {1}}};
    for (int k = 0; k < extra_; ++k) p.push_back({"extra." + std::to_string(k), {1}});
    return p;
  }

  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + style_.init_offset;
    const std::int64_t half = std::int64_t(style_.init_grid / 2);
    for (std::size_t i = 0; i < params.size(); ++i) {
      for (float& v : params[i]) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v = float(std::int64_t(s % style_.init_grid) - half) / float(style_.init_grid);
      }
    }
  }

  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override {
    p_.assign(params.begin(), params.end());
    g_.assign(grads.begin(), grads.end());
  }

  float forward(const Batch& b) override {
    const int call = forward_calls_++;
    load();
    B_ = int(b.batch);
    x_.assign(b.features.begin(), b.features.end());
    t_.resize(std::size_t(B_));
    for (int i = 0; i < B_; ++i) t_[std::size_t(i)] = float(b.targets[std::size_t(i)]);
    h_act_.assign(std::size_t(B_) * std::size_t(h_), 0.f);
    y_.assign(std::size_t(B_), 0.f);
    double loss = 0;
    for (int n = 0; n < B_; ++n) {
      float y = w_[3][0];
      for (int k = 0; k < extra_; ++k) y += w_[4 + std::size_t(k)][0];
      for (int j = 0; j < h_; ++j) {
        float z = w_[1][std::size_t(j)];
        for (int i = 0; i < d_; ++i) z += w_[0][std::size_t(j * d_ + i)] * x_[std::size_t(n * d_ + i)];
        const float a = style_.act == MlpStyle::Act::Relu ? (z > 0 ? z : 0) : std::tanh(z);
        h_act_[std::size_t(n * h_ + j)] = a;
        y += w_[2][std::size_t(j)] * a;
      }
      y_[std::size_t(n)] = y;
      const double e = double(y) - t_[std::size_t(n)];
      loss += 0.5 * e * e;
    }
    if (nan_loss_on_forward.count(call)) return std::numeric_limits<float>::quiet_NaN();
    return float(loss / B_);
  }

  bool in_backward = false;  // true while backward() runs (overlap test)

  void backward(float scale, const std::function<void(std::size_t)>& ready) override {
    in_backward = true;
    struct Reset { bool& b; ~Reset() { b = false; } } reset{in_backward};
    const int call = backward_calls_++;
    std::vector<std::vector<float>> g(w_.size());
    for (std::size_t i = 0; i < w_.size(); ++i) g[i].assign(w_[i].size(), 0.f);
    for (int n = 0; n < B_; ++n) {
      const float dy = scale * (y_[std::size_t(n)] - t_[std::size_t(n)]) / float(B_);
      g[3][0] += dy;
      for (int k = 0; k < extra_; ++k) g[4 + std::size_t(k)][0] += dy;
      for (int j = 0; j < h_; ++j) {
        const float a = h_act_[std::size_t(n * h_ + j)];
        g[2][std::size_t(j)] += dy * a;
        float dz;
        if (style_.act == MlpStyle::Act::Relu) {
          if (a <= 0) continue;
          dz = dy * w_[2][std::size_t(j)];
        } else {
          dz = dy * w_[2][std::size_t(j)] * (1.0f - a * a);
        }
        g[1][std::size_t(j)] += dz;
        for (int i = 0; i < d_; ++i) g[0][std::size_t(j * d_ + i)] += dz * x_[std::size_t(n * d_ + i)];
      }
    }
    if (inf_grad_on_backward.count(call)) g[1][0] = std::numeric_limits<float>::infinity();
    // Accumulate in reverse parameter order (what a real backward does), reporting each.
    std::vector<std::size_t> idx(w_.size());
    for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = idx.size() - 1 - i;
    if (order == ReadyOrder::Forward) std::reverse(idx.begin(), idx.end());
    std::unique_ptr<GroupUse> use;
    std::size_t held = SIZE_MAX;
    for (std::size_t i : idx) {
      const std::size_t group = i < 2 ? 0 : 1;
      if (grouped && group != held) {
        use.reset();
        use = std::make_unique<GroupUse>(hooks, group, Pass::Backward);
        held = group;
      }
      accumulate(i, g[i]);
      if (order != ReadyOrder::Never) ready(i);
      if (order == ReadyOrder::Twice) ready(i);
    }
  }

  int forward_calls() const { return forward_calls_; }

 private:
  void load() {
    w_.resize(p_.size());
    std::unique_ptr<GroupUse> use;
    for (std::size_t i = 0; i < p_.size(); ++i) {
      if (grouped && (i == 0 || i == 2)) {
        use.reset();
        use = std::make_unique<GroupUse>(hooks, i == 0 ? 0 : 1, Pass::Forward);
      }
      w_[i].resize(p_[i].count);
      for (std::size_t k = 0; k < p_[i].count; ++k) w_[i][k] = ds::test::load(p_[i], k);
    }
  }
  void accumulate(std::size_t i, const std::vector<float>& g) {
    for (std::size_t k = 0; k < g.size(); ++k) ds::test::store(g_[i], k, ds::test::load(g_[i], k) + g[k]);
  }

  int d_, h_, extra_;
  MlpStyle style_;
  std::vector<TensorView> p_, g_;
  std::vector<std::vector<float>> w_;
  std::vector<float> x_, t_, h_act_, y_;
  int B_ = 0;
  int forward_calls_ = 0, backward_calls_ = 0;
};

}  // namespace ds::test
