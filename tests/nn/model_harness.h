// Test helper: the engine's side of ds::Module in miniature -- flat per-parameter storage in
// a chosen working dtype, init, bind, gradient read-back -- and what the model tests share: a
// random token batch, randomized parameters, the whole-model finite-difference check.
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "ds/core/half.h"
#include "ds/core/module.h"

namespace dstest {

struct Harness {
  ds::Module& m;
  std::vector<ds::ParamInfo> infos;
  std::vector<std::vector<float>> master;  // fp32 values
  std::vector<std::vector<std::uint16_t>> p16, g16;
  std::vector<std::vector<float>> g32;
  ds::DType dt;

  Harness(ds::Module& mod, std::uint64_t seed, ds::DType dtype = ds::DType::F32) : m(mod), dt(dtype) {
    infos = m.parameters();
    master.resize(infos.size());
    std::vector<std::span<float>> spans;
    for (std::size_t i = 0; i < infos.size(); ++i) {
      master[i].resize(infos[i].numel());
      spans.push_back(master[i]);
    }
    m.init_parameters(spans, seed);
    rebind();
  }
  // (Re)writes the working copies from master and binds them.
  void rebind() {
    std::vector<ds::TensorView> pv, gv;
    p16.resize(infos.size());
    g16.resize(infos.size());
    g32.resize(infos.size());
    for (std::size_t i = 0; i < infos.size(); ++i) {
      const std::size_t n = infos[i].numel();
      if (dt == ds::DType::F32) {
        g32[i].assign(n, 0.0f);
        pv.push_back({master[i].data(), n, dt});
        gv.push_back({g32[i].data(), n, dt});
      } else {
        p16[i].resize(n);
        g16[i].assign(n, 0);
        ds::convert(master[i].data(), ds::DType::F32, p16[i].data(), dt, n);
        pv.push_back({p16[i].data(), n, dt});
        gv.push_back({g16[i].data(), n, dt});
      }
    }
    m.bind(pv, gv);
  }
  std::vector<float> grad(std::size_t i) const {
    const std::size_t n = infos[i].numel();
    if (dt == ds::DType::F32) return g32[i];
    std::vector<float> out(n);
    ds::convert(g16[i].data(), dt, out.data(), ds::DType::F32, n);
    return out;
  }
  void zero_grads() {
    for (auto& g : g32) std::fill(g.begin(), g.end(), 0.0f);
    for (auto& g : g16) std::fill(g.begin(), g.end(), 0);
  }
};

// batch x seq random token ids below vocab (inputs and targets), as a ds::Batch.
struct TokenBatch {
  std::vector<std::int32_t> in, tg;
  ds::Batch batch;
  TokenBatch(std::int64_t B, std::int64_t T, std::int64_t V, std::uint64_t seed) : in(B * T), tg(B * T) {
    std::mt19937_64 g(seed);
    for (auto& x : in) x = std::int32_t(g() % std::uint64_t(V));
    for (auto& x : tg) x = std::int32_t(g() % std::uint64_t(V));
    batch.inputs = in;
    batch.targets = tg;
    batch.batch = B;
    batch.seq = T;
  }
};

// Every parameter N(0, scale) -- larger than the inits, so every path carries signal -- and
// the norm weights (LayerNorm "ln_*.weight", RMSNorm "*norm.weight") 1 + N(0, scale).
inline void randomize(Harness& h, std::uint64_t seed, float scale) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  for (std::size_t i = 0; i < h.master.size(); ++i) {
    const std::string& n = h.infos[i].name;
    const bool norm = (n.find("ln_") != std::string::npos || n.find("norm") != std::string::npos) &&
                      n.find("weight") != std::string::npos;
    for (auto& v : h.master[i]) v = norm ? 1.0f + d(g) : d(g);
  }
  h.rebind();
}

// Whole-model gradient check in fp32: central differences (h = 1e-2) of the mean loss on up
// to `samples` elements of every parameter. Returns per parameter tensor the relative error
// |g - n| / (|g| + |n|) over the sampled elements (as vectors); the tests want < 2e-2.
inline std::vector<double> fd_relative_errors(Harness& h, ds::Module& m, const ds::Batch& b, int samples) {
  h.zero_grads();
  m.forward(b);
  m.backward(1.0f, {});
  std::mt19937_64 g(7);
  std::vector<double> out;
  for (std::size_t i = 0; i < h.infos.size(); ++i) {
    const std::vector<float> an = h.grad(i);
    double diff = 0, norm = 0;
    const std::size_t n = h.master[i].size();
    for (int s = 0; s < samples; ++s) {
      const std::size_t j = n <= std::size_t(samples) ? std::size_t(s) % n : std::size_t(g() % n);
      const float keep = h.master[i][j];
      const float eps = 1e-2f;
      h.master[i][j] = keep + eps;
      const double lp = m.evaluate(b);
      h.master[i][j] = keep - eps;
      const double lm = m.evaluate(b);
      h.master[i][j] = keep;
      const double num = (lp - lm) / (2.0 * eps);
      diff += (an[j] - num) * (an[j] - num);
      norm += std::fabs(an[j]) * std::fabs(an[j]) + num * num;
    }
    out.push_back(std::sqrt(diff) / (std::sqrt(norm) + 1e-12));
  }
  return out;
}

}  // namespace dstest
