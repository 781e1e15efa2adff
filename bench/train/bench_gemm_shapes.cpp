// GEMM rate at each shape one GPT training step runs (bench shape by default), per
// implementation: OpenBLAS sgemm, our fp32 kernel, our bf16 kernel. Times are per-call CPU
// time of the calling process (medians), so a loaded machine inflates them less than wall time.
// Prints one row per shape with the calls per step and the share of the step's GEMM FLOPs.
//
// Check: at every shape our fp32 and bf16 kernels' output against OpenBLAS's (largest
// difference over the largest |value|: fp32 1e-4, bf16 3e-2, bf16 inputs); a larger one fails
// the run (exit 1). Headline: the median over the shapes of our fp32 kernel's rate over
// OpenBLAS's; --min_ratio X fails the run (exit 3) below X. The last line is its JSON: record.
//
//   bench_gemm_shapes [--embd 256] [--tokens 1024] [--seq 128] [--heads 4] [--reps 9] [--min_ratio X]
#include <cblas.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/nn/gemm.h"
#include "bench_report.h"

namespace {

double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

struct Shape {
  const char* what;
  bool ta, tb;
  std::int64_t M, N, K;
  int calls;  // per training step
};

template <class F>
double median_s(F&& f, int reps) {
  std::vector<double> t;
  f();
  for (int r = 0; r < reps; ++r) {
    const double t0 = cpu_now();
    f();
    t.push_back(cpu_now() - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t C = 256, BT = 1024, T = 128, NH = 4, L = 4, V = 256;
  int reps = 9;
  double min_ratio = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::stoll(i + 1 < argc ? argv[++i] : "0"); };
    if (a == "--min_ratio") {
      min_ratio = ds::bench::parse_min_ratio("bench_gemm_shapes", i + 1 < argc ? argv[++i] : "");
      continue;
    }
    if (a == "--embd") C = next();
    else if (a == "--tokens") BT = next();
    else if (a == "--seq") T = next();
    else if (a == "--heads") NH = next();
    else if (a == "--reps") reps = int(next());
    else {
      std::fprintf(stderr, "bench_gemm_shapes: error: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (reps < 1) {
    std::fprintf(stderr, "bench_gemm_shapes: error: --reps must be at least 1\n");
    return 2;
  }
  const std::int64_t hd = C / NH, BH = BT / T * NH;
  const int l = int(L);
  std::vector<Shape> shapes = {
      {"qkv fwd", false, true, BT, 3 * C, C, l},        {"attproj fwd", false, true, BT, C, C, l},
      {"fc fwd", false, true, BT, 4 * C, C, l},         {"fcproj fwd", false, true, BT, C, 4 * C, l},
      {"lmhead fwd", false, true, BT, V, C, 1},         {"qkv dinp", false, false, BT, C, 3 * C, l},
      {"attproj dinp", false, false, BT, C, C, l},      {"fc dinp", false, false, BT, C, 4 * C, l},
      {"fcproj dinp", false, false, BT, 4 * C, C, l},   {"lmhead dinp", false, false, BT, C, V, 1},
      {"qkv dw", true, false, 3 * C, C, BT, l},         {"attproj dw", true, false, C, C, BT, l},
      {"fc dw", true, false, 4 * C, C, BT, l},          {"fcproj dw", true, false, C, 4 * C, BT, l},
      {"lmhead dw", true, false, V, C, BT, 1},
      {"att QK^T, dY V^T (per head)", false, true, T, T, hd, int(2 * BH * L)},
      {"att PV, dS K (per head)", false, false, T, hd, T, int(2 * BH * L)},
      {"att P^T dY, dS^T Q (per head)", true, false, T, hd, T, int(2 * BH * L)},
  };
  const std::int64_t maxe = std::max<std::int64_t>(BT * 4 * C, 1024 * 1024);
  ds::HostBuffer a(std::size_t(maxe), ds::DType::F32), b(std::size_t(maxe), ds::DType::F32),
      c(std::size_t(maxe), ds::DType::F32);
  for (std::size_t i = 0; i < a.count(); ++i) a.as<float>()[i] = float(i % 7) * 0.1f - 0.3f;
  for (std::size_t i = 0; i < b.count(); ++i) b.as<float>()[i] = float(i % 5) * 0.1f - 0.2f;
  const float *A = a.as<float>(), *B = b.as<float>();
  float* Cm = c.as<float>();
  auto blas = [&](const Shape& s) {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans, int(s.M),
                int(s.N), int(s.K), 1.0f, A, int(s.ta ? s.M : s.K), B, int(s.tb ? s.K : s.N), 0.0f, Cm, int(s.N));
  };
  auto own = [&](const Shape& s, ds::nn::Precision p) {
    auto f = p == ds::nn::Precision::F32 ? ds::nn::gemm_f32 : ds::nn::gemm_bf16;
    f(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A, s.ta ? s.M : s.K, B, s.tb ? s.K : s.N, 0.0f, Cm, s.N);
  };
  std::printf("threads %d, CPU kernel set %s, OpenBLAS core %s; GFLOP/s by CPU time (median of %d)\n",
              omp_get_max_threads(), ds::isa_name(ds::cpu_isa()), openblas_get_corename(), reps);
  const Shape sq{"square 1024", false, true, 1024, 1024, 1024, 0};
  std::printf("| shape | M x N x K | calls/step | openblas | own fp32 | own bf16 | openblas ms/step |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  double tot_ms = 0, tot_flop = 0;
  ds::bench::Report report("bench_gemm_shapes");
  report.min_ratio(min_ratio);
  std::vector<double> ratios;
  double worst_f32 = 0, worst_bf16 = 0;
  std::vector<float> ref;
  // Largest |ours - OpenBLAS| over the largest |OpenBLAS| at shape s (Cm holds ours).
  auto rel_diff = [&](const Shape& s) {
    double d = 0, m = 0;
    for (std::size_t i = 0; i < std::size_t(s.M * s.N); ++i) {
      d = std::max(d, double(std::fabs(Cm[i] - ref[i])));
      m = std::max(m, double(std::fabs(ref[i])));
    }
    return std::isfinite(d) ? d / std::max(m, 1e-30) : INFINITY;
  };
  for (const Shape& s : shapes) {
    blas(s);
    ref.assign(Cm, Cm + s.M * s.N);
    if (ds::nn::f32_gemm_supported()) {
      own(s, ds::nn::Precision::F32);
      worst_f32 = std::max(worst_f32, rel_diff(s));
    }
    if (ds::nn::bf16_gemm_supported()) {
      own(s, ds::nn::Precision::BF16);
      worst_bf16 = std::max(worst_bf16, rel_diff(s));
    }
    const double fl = 2.0 * double(s.M * s.N * s.K);
    const double tb = median_s([&] { blas(s); }, reps);
    const double tf = ds::nn::f32_gemm_supported() ? median_s([&] { own(s, ds::nn::Precision::F32); }, reps) : 0;
    const double th = ds::nn::bf16_gemm_supported() ? median_s([&] { own(s, ds::nn::Precision::BF16); }, reps) : 0;
    if (tf > 0) ratios.push_back(tb / tf);
    tot_ms += 1e3 * tb * s.calls;
    tot_flop += fl * s.calls;
    std::printf("| %s | %lld x %lld x %lld | %d | %.1f | %.1f | %.1f | %.2f |\n", s.what, (long long)s.M,
                (long long)s.N, (long long)s.K, s.calls, fl / tb / 1e9, tf > 0 ? fl / tf / 1e9 : 0,
                th > 0 ? fl / th / 1e9 : 0, 1e3 * tb * s.calls);
  }
  const double fl = 2.0 * 1024 * 1024 * 1024;
  std::printf("| %s | 1024^3 | - | %.1f | %.1f | %.1f | - |\n", sq.what, fl / median_s([&] { blas(sq); }, reps) / 1e9,
              ds::nn::f32_gemm_supported() ? fl / median_s([&] { own(sq, ds::nn::Precision::F32); }, reps) / 1e9 : 0,
              ds::nn::bf16_gemm_supported() ? fl / median_s([&] { own(sq, ds::nn::Precision::BF16); }, reps) / 1e9 : 0);
  std::printf("OpenBLAS, all step GEMMs: %.1f ms, %.1f GFLOP -> %.1f GFLOP/s\n", tot_ms, tot_flop / 1e9,
              tot_flop / tot_ms / 1e6);
  report["threads"] = omp_get_max_threads();
  report["openblas_core"] = openblas_get_corename();
  report["openblas_step_gemm_ms"] = tot_ms;
  report["openblas_step_gflops"] = tot_flop / tot_ms / 1e6;
  char detail[160];
  std::snprintf(detail, sizeof detail, "largest difference over largest |value|: fp32 %.2g (limit 1e-4), bf16 %.2g (limit 3e-2), %zu shapes",
                worst_f32, worst_bf16, shapes.size());
  report.check("our GEMM kernels' output equals OpenBLAS's", worst_f32 <= 1e-4 && worst_bf16 <= 3e-2, detail);
  report.headline("own fp32 GEMM rate / OpenBLAS sgemm rate, median over " + std::to_string(ratios.size()) + " shapes",
                  ds::bench::median(ratios));
  return report.finish();
}
