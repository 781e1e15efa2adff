// What the CUDA model tests (test_cuda_gpt.cpp, test_cuda_llama.cpp) share: the CPU twin and
// the GPU model bound to the same initial values (host fp32 / device buffers of a dtype), the
// error measures they compare with, and an error-message check.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/core/module.h"

namespace cuda_test {

// v rounded to dtype t and back to fp32.
inline std::vector<float> rounded(const std::vector<float>& v, ds::DType t) {
  if (t == ds::DType::F32) return v;
  const auto b = to_dtype(v, t);
  std::vector<float> out(v.size());
  ds::convert(b.data(), t, out.data(), ds::DType::F32, v.size());
  return out;
}

// The fp32 initial values, drawn by the model's init_parameters.
inline std::vector<std::vector<float>> init_values(ds::Module& m, std::uint64_t seed) {
  const auto infos = m.parameters();
  std::vector<std::vector<float>> p(infos.size());
  std::vector<std::span<float>> spans;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    p[i].resize(infos[i].numel());
    spans.push_back(p[i]);
  }
  m.init_parameters(spans, seed);
  return p;
}

// A CPU model (built from args) bound to host fp32 copies of params / grads.
template <class Model>
struct CpuModel {
  Model m;
  std::vector<std::vector<float>> p, g;
  template <class... Args>
  CpuModel(const std::vector<std::vector<float>>& params, const std::vector<std::vector<float>>& grads,
           Args&&... args)
      : m(std::forward<Args>(args)...), p(params), g(grads) {
    std::vector<ds::TensorView> pv, gv;
    for (std::size_t i = 0; i < p.size(); ++i) {
      pv.push_back({p[i].data(), p[i].size(), ds::DType::F32});
      gv.push_back({g[i].data(), g[i].size(), ds::DType::F32});
    }
    m.bind(pv, gv);
  }
};

// A CUDA model (built from args) bound to device buffers of dtype t holding params / grads
// (rounded to t).
template <class Model>
struct GpuModel {
  Model m;
  ds::DType t;
  std::vector<std::unique_ptr<Dev>> p, g;
  std::vector<ds::TensorView> pv, gv;
  template <class... Args>
  GpuModel(const std::vector<std::vector<float>>& params, const std::vector<std::vector<float>>& grads,
           ds::DType dt, Args&&... args)
      : m(std::forward<Args>(args)...), t(dt) {
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto pb = to_dtype(params[i], t), gb = to_dtype(grads[i], t);
      p.push_back(std::make_unique<Dev>(pb.data(), pb.size()));
      g.push_back(std::make_unique<Dev>(gb.data(), gb.size()));
      pv.push_back({p.back()->ptr, params[i].size(), t});
      gv.push_back({g.back()->ptr, grads[i].size(), t});
    }
    m.bind(pv, gv);
  }
  void sync() { CU(cudaStreamSynchronize(static_cast<cudaStream_t>(m.device_stream()))); }
  // Gradient i as fp32 on the host (after the model's stream).
  std::vector<float> grad(std::size_t i) {
    sync();
    std::vector<unsigned char> b(g[i]->bytes);
    g[i]->to_host(b.data());
    std::vector<float> out(gv[i].count);
    ds::convert(b.data(), t, out.data(), ds::DType::F32, out.size());
    return out;
  }
};

inline double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float x : a) m = std::max(m, double(std::fabs(x)));
  return m;
}
inline double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * double(ref[i]);
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// Every gradient of gpu (a GpuModel) within relative L2 tol of cpu's fp32 ones (infos: the
// parameters); prints the worst. label: "bf16", "gqa bf16" (messages).
template <class Gpu>
void expect_half_grads_close(Gpu& gpu, const std::vector<std::vector<float>>& cpu_grads,
                             const std::vector<ds::ParamInfo>& infos, double tol, const std::string& label) {
  double worst = 0;
  std::string worst_name;
  for (std::size_t i = 0; i < infos.size(); ++i) {
    const double err = rel_l2(gpu.grad(i), cpu_grads[i]);
    if (!(err <= worst)) { worst = err; worst_name = infos[i].name; }
    EXPECT(err <= tol, "%s gradient '%s': relative L2 error %.3e > %.2f", label.c_str(), infos[i].name.c_str(), err,
           tol);
  }
  std::printf("%s: worst gradient relative L2 error %.2e (%s), bound %.2f\n", label.c_str(), worst,
              worst_name.c_str(), tol);
}

// The same sampler on (nearly) the same logits: gpu.generate's tokens are in [0, vocab);
// prints how many agree with cpu.generate's. label prefixes the lines.
template <class Cpu, class Gpu>
void expect_generation_close(Cpu& cpu, Gpu& gpu, std::span<const std::int32_t> prompt, std::int64_t vocab,
                             const std::string& label) {
  for (float temp : {0.0f, 1.0f}) {
    const auto gc = cpu.generate(prompt, 8, temp, 99), gg = gpu.generate(prompt, 8, temp, 99);
    bool in_range = gg.size() == 8;
    for (auto x : gg) in_range = in_range && x >= 0 && x < vocab;
    std::size_t agree = 0;
    for (std::size_t i = 0; i < std::min(gc.size(), gg.size()); ++i) agree += gc[i] == gg[i];
    std::printf("%s: generate temperature %.1f: %zu of 8 tokens equal to the CPU model's\n", label.c_str(),
                double(temp), agree);
    EXPECT(in_range, "generate returned %zu tokens or a token out of range", gg.size());
  }
}

// Whether f throws a ds::Error containing needle (null: any); its text into *what.
template <typename F>
bool throws_error(F&& f, const char* needle, std::string* what = nullptr) {
  try {
    f();
  } catch (const ds::Error& e) {
    if (what) *what = e.what();
    return needle == nullptr || std::string(e.what()).find(needle) != std::string::npos;
  }
  return false;
}

}  // namespace cuda_test
