// Test fixtures for the engine: the small MLP regression Module of tests/common/test_mlp.h
// (fp32 math, any working dtype, fault injection), a wide linear Module, a world-size-1
// Communicator, and data.
#pragma once

#include "../common/elem.h"
#include "../common/self_comm.h"
#include "../common/test_mlp.h"
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ds/core/half.h"
#include "ds/core/module.h"
#include "ds/mpi/communicator.h"

namespace ds::test {

// y = c * sum_l sum_i w_l[i] * x[(l + i) % d], c = 1 / sqrt(L n); loss = mean (y - t)^2 / 2.
// L parameter tensors "w.l" of n elements each: backward accumulates and reports them one by
// one, last first, so gradient buckets fill and are reduced while backward runs (the ZeRO-2
// memory test). `after_ready` (when set) runs after each report.
class WideLinear : public Module {
 public:
  WideLinear(int tensors, int numel) : L_(tensors), n_(numel), c_(1.0f / std::sqrt(float(tensors) * float(numel))) {}
  std::function<void()> after_ready;
  const TensorView& grad(std::size_t l) const { return g_[l]; }

  std::vector<ParamInfo> parameters() const override {
    std::vector<ParamInfo> p;
    for (int l = 0; l < L_; ++l) p.push_back({"w." + std::to_string(l), {n_}});
    return p;
  }
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 3;
    for (const auto& p : params)
      for (float& v : p) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v = float(std::int64_t(s % 64) - 32) / 64.0f;
      }
  }
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override {
    p_.assign(params.begin(), params.end());
    g_.assign(grads.begin(), grads.end());
  }
  float forward(const Batch& b) override {
    B_ = int(b.batch);
    d_ = int(b.feature_dim);
    x_.assign(b.features.begin(), b.features.end());
    r_.assign(std::size_t(B_), 0.f);
    double loss = 0;
    for (int s = 0; s < B_; ++s) {
      const float* x = x_.data() + std::size_t(s) * std::size_t(d_);
      double y = 0;
      for (int l = 0; l < L_; ++l)
        for (int i = 0; i < n_; ++i) y += double(ds::test::load(p_[std::size_t(l)], std::size_t(i))) * x[(l + i) % d_];
      const double e = y * c_ - double(b.targets[std::size_t(s)]);
      r_[std::size_t(s)] = float(e);
      loss += 0.5 * e * e;
    }
    return float(loss / B_);
  }
  void backward(float scale, const std::function<void(std::size_t)>& ready) override {
    for (int l = L_ - 1; l >= 0; --l) {
      const TensorView& g = g_[std::size_t(l)];
      for (int i = 0; i < n_; ++i) {
        float acc = 0;
        for (int s = 0; s < B_; ++s) acc += r_[std::size_t(s)] * x_[std::size_t(s) * std::size_t(d_) + std::size_t((l + i) % d_)];
        ds::test::store(g, std::size_t(i), ds::test::load(g, std::size_t(i)) + scale * c_ * acc / float(B_));
      }
      ready(std::size_t(l));
      if (after_ready) after_ready();
    }
  }

 private:
  int L_, n_;
  float c_;
  int B_ = 0, d_ = 1;
  std::vector<TensorView> p_, g_;
  std::vector<float> x_, r_;
};

// A deterministic data set: features are multiples of 1/4 in [-1, 1], targets small ints.
struct Data {
  int d;
  std::vector<float> x;
  std::vector<std::int32_t> t;
  Data(int n, int dim, std::uint64_t seed = 7) : d(dim) {
    std::uint64_t s = seed + 12345;
    auto next = [&] { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
    for (int i = 0; i < n * dim; ++i) x.push_back(float(std::int64_t(next() % 9) - 4) / 4.0f);
    for (int i = 0; i < n; ++i) t.push_back(std::int32_t(next() % 5) - 2);
  }
  // Samples [first, first + count).
  Batch batch(int first, int count) const {
    Batch b;
    b.features = std::span<const float>(x.data() + std::size_t(first) * std::size_t(d), std::size_t(count * d));
    b.targets = std::span<const std::int32_t>(t.data() + first, std::size_t(count));
    b.batch = count;
    b.feature_dim = d;
    return b;
  }
};

// Forwards to another communicator and counts the non-blocking all-reduces started while
// `probe()` is true (e.g. while the module's backward runs).
class RecordingComm final : public Communicator {
 public:
  RecordingComm(std::shared_ptr<Communicator> inner, std::function<bool()> probe)
      : inner_(std::move(inner)), probe_(std::move(probe)) {}
  int started_during = 0, started_total = 0;
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }
  void all_reduce(TensorView b, ReduceOp op) override { inner_->all_reduce(b, op); }
  CommWork iall_reduce(TensorView b, ReduceOp op) override {
    ++started_total;
    if (probe_()) ++started_during;
    return inner_->iall_reduce(b, op);
  }
  void reduce_scatter(TensorView s, TensorView r, ReduceOp op) override { inner_->reduce_scatter(s, r, op); }
  CommWork ireduce_scatter(TensorView s, TensorView r, ReduceOp op) override { return inner_->ireduce_scatter(s, r, op); }
  void all_gather(TensorView s, TensorView r) override { inner_->all_gather(s, r); }
  CommWork iall_gather(TensorView s, TensorView r) override { return inner_->iall_gather(s, r); }
  void broadcast(TensorView b, int root) override { inner_->broadcast(b, root); }
  void barrier() override { inner_->barrier(); }

 private:
  std::shared_ptr<Communicator> inner_;
  std::function<bool()> probe_;
};

}  // namespace ds::test
