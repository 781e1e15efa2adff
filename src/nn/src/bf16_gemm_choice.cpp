// kernels.cpu_bf16_gemm (ds/nn/gemm.h): whether bf16 working parameters run their Linear GEMMs
// in bf16. vdpbf16ps ran from 0.49x to 1.8x the FLOP rate of fp32 FMA on the CPUs measured,
// so "auto" times the two kernels on this CPU instead of guessing from its name. The rule is
// a fixed ratio, the same on every machine; the train app makes the ranks agree on the result
// (ranks must compute the same numbers).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/nn/gemm.h"

namespace ds::nn {

namespace {

// One Linear-like shape small enough that both kernels stay on the calling thread (they split
// work above 2^21 multiply-adds): about 4 MFLOP, tens of microseconds a run.
constexpr std::int64_t kM = 96, kN = 128, kK = 160;

// -1: not fixed (each process's own "auto"), 0: fp32, 1: bf16.
std::atomic<int> g_fixed{-1};

}  // namespace

CpuBf16Gemm parse_cpu_bf16_gemm(std::string_view text, std::string_view what) {
  if (text == "auto") return CpuBf16Gemm::Auto;
  if (text == "on") return CpuBf16Gemm::On;
  if (text == "off") return CpuBf16Gemm::Off;
  DS_THROW(what << ": '" << text << "' is not one of auto, on, off");
}

const Bf16GemmTiming& measure_bf16_gemm() {
  static const Bf16GemmTiming timing = [] {
    Bf16GemmTiming t;
    if (!bf16_gemm_supported() || !f32_gemm_supported()) return t;
    std::vector<float> a(std::size_t(kM * kK)), b(std::size_t(kK * kN)), c(std::size_t(kM * kN));
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = float(int(i % 17) - 8) * 0.125f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 13) - 6) * 0.25f;
    using clock = std::chrono::steady_clock;
    auto time = [&](bool bf16) {
      const auto t0 = clock::now();
      if (bf16) gemm_bf16(false, true, kM, kN, kK, 1.0f, a.data(), kK, b.data(), kK, 0.0f, c.data(), kN);
      else gemm_f32(false, true, kM, kN, kK, 1.0f, a.data(), kK, b.data(), kK, 0.0f, c.data(), kN);
      return std::chrono::duration<double>(clock::now() - t0).count();
    };
    (void)time(false);  // first touch of the packing buffers and the code
    (void)time(true);
    t.f32_seconds = t.bf16_seconds = std::numeric_limits<double>::infinity();
    // Interleaved, best of each: a burst of load from other processes hits both alike.
    for (int r = 0; r < kBf16GemmRuns; ++r) {
      t.f32_seconds = std::min(t.f32_seconds, time(false));
      t.bf16_seconds = std::min(t.bf16_seconds, time(true));
    }
    t.faster = t.bf16_seconds * kBf16GemmMinSpeedup <= t.f32_seconds;
    return t;
  }();
  return timing;
}

bool cpu_bf16_gemm_choice(CpuBf16Gemm mode) {
  switch (mode) {
    case CpuBf16Gemm::On: return bf16_gemm_supported();
    case CpuBf16Gemm::Off: return false;
    case CpuBf16Gemm::Auto: break;
  }
  return measure_bf16_gemm().faster;
}

void set_cpu_bf16_gemm(bool use_bf16) { g_fixed.store(use_bf16 ? 1 : 0); }

Precision layer_precision(bool bf16_working) {
  if (!bf16_working) return Precision::F32;
  const int fixed = g_fixed.load();
  const bool bf16 = fixed >= 0 ? fixed == 1 : cpu_bf16_gemm_choice(CpuBf16Gemm::Auto);
  return bf16 && bf16_gemm_supported() ? Precision::BF16 : Precision::F32;
}

}  // namespace ds::nn
