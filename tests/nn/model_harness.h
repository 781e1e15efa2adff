// Test helper: the engine's side of ds::Module in miniature -- flat per-parameter storage in
// a chosen working dtype, init, bind, gradient read-back.
#pragma once

#include <cstring>
#include <span>
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

}  // namespace dstest
