// A small Module for checkpoint tests: y = w2 . tanh(W1 x + b1) + b2 + sum(extra), MSE loss.
// fp32 math on any working dtype (fp32 / fp16 / bf16 parameters and gradients), gradients
// accumulated (+=) into the bound views as the Module contract requires. The `extra`
// single-element tensors make parameters smaller than a ZeRO partition (straddling cases).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ds/core/half.h"
#include "ds/core/module.h"
#include "../common/elem.h"

namespace ds::io::test {

class CkptMlp : public Module {
 public:
  CkptMlp(int d, int h, int extra) : d_(d), h_(h), extra_(extra) {}

  std::vector<ParamInfo> parameters() const override {
    std::vector<ParamInfo> p{{"l1.weight", {h_, d_}}, {"l1.bias", {h_}}, {"l2.weight", {1, h_}}, {"l2.bias", {1}}};
    for (int k = 0; k < extra_; ++k) p.push_back({"extra." + std::to_string(k), {1}});
    return p;
  }

  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
    for (const auto& t : params)
      for (float& v : t) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v = float(std::int64_t(s % 128) - 64) / 128.0f;
      }
  }

  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override {
    p_.assign(params.begin(), params.end());
    g_.assign(grads.begin(), grads.end());
  }

  float forward(const Batch& b) override {
    w_.resize(p_.size());
    for (std::size_t i = 0; i < p_.size(); ++i) {
      w_[i].resize(p_[i].count);
      for (std::size_t k = 0; k < p_[i].count; ++k) w_[i][k] = ds::test::load(p_[i], k);
    }
    n_ = int(b.batch);
    x_.assign(b.features.begin(), b.features.end());
    t_.assign(b.targets.begin(), b.targets.end());
    a_.assign(std::size_t(n_ * h_), 0.f);
    y_.assign(std::size_t(n_), 0.f);
    double loss = 0;
    for (int n = 0; n < n_; ++n) {
      float y = w_[3][0];
      for (int k = 0; k < extra_; ++k) y += w_[4 + std::size_t(k)][0];
      for (int j = 0; j < h_; ++j) {
        float z = w_[1][std::size_t(j)];
        for (int i = 0; i < d_; ++i) z += w_[0][std::size_t(j * d_ + i)] * x_[std::size_t(n * d_ + i)];
        const float a = std::tanh(z);
        a_[std::size_t(n * h_ + j)] = a;
        y += w_[2][std::size_t(j)] * a;
      }
      y_[std::size_t(n)] = y;
      const double e = double(y) - double(t_[std::size_t(n)]);
      loss += 0.5 * e * e;
    }
    return float(loss / n_);
  }

  void backward(float scale, const std::function<void(std::size_t)>& ready) override {
    std::vector<std::vector<float>> g(w_.size());
    for (std::size_t i = 0; i < w_.size(); ++i) g[i].assign(w_[i].size(), 0.f);
    for (int n = 0; n < n_; ++n) {
      const float dy = scale * (y_[std::size_t(n)] - float(t_[std::size_t(n)])) / float(n_);
      g[3][0] += dy;
      for (int k = 0; k < extra_; ++k) g[4 + std::size_t(k)][0] += dy;
      for (int j = 0; j < h_; ++j) {
        const float a = a_[std::size_t(n * h_ + j)];
        g[2][std::size_t(j)] += dy * a;
        const float dz = dy * w_[2][std::size_t(j)] * (1.0f - a * a);
        g[1][std::size_t(j)] += dz;
        for (int i = 0; i < d_; ++i) g[0][std::size_t(j * d_ + i)] += dz * x_[std::size_t(n * d_ + i)];
      }
    }
    for (std::size_t i = g.size(); i-- > 0;) {
      for (std::size_t k = 0; k < g[i].size(); ++k) ds::test::store(g_[i], k, ds::test::load(g_[i], k) + g[i][k]);
      ready(i);
    }
  }

 private:
  int d_, h_, extra_;
  std::vector<TensorView> p_, g_;
  std::vector<std::vector<float>> w_;
  std::vector<float> x_, a_, y_;
  std::vector<std::int32_t> t_;
  int n_ = 0;
};

}  // namespace ds::io::test
