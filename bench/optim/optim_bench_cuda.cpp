// GPU optimizer-kernel benchmark (not a test; needs a GPU, exits 77 without one): the CUDA
// Adam/AdamW, SGD, Adagrad and Lamb kernels and the precision kernels (fp32 -> bf16 cast,
// grad stats) in GB/s as a ratio to a device-to-device copy moving the same bytes
// (cudaMemcpyAsync of bytes/2: it reads and writes them), measured in the same run with
// CUDA events; median of repeats after a warm-up. "B/param" counts every byte a kernel must
// read or write once per parameter (AdamW fp32: p, m, v, g read + p, m, v written = 28).
// Check: after timing, each kernel runs once more on random inputs (the first
// min(params, 2^22 + 3) elements: an odd count, so the guarded tail runs too) and its output
// is compared with the plain CPU reference (*_ref of ds_optim, grad_stats_ref) with the
// tolerances of tests/cuda/test_cuda_optim_kernels.cpp: Adam, SGD, Adagrad and the cast
// bitwise (master, states, working copy); Lamb's moments bitwise, its master and trust ratio
// to 2e-6 relative; the grad sum of squares to 1e-12 relative. A difference fails the run.
// Headline: AdamW fp32 GB/s / D2D copy GB/s (target >= 0.80, printed as before); --min_ratio X
// fails the run below X. The last line is its JSON: record (bench/README.md).
//
//   optim_bench_cuda [params=100000000] [repeats=20] [--min_ratio X]
//
// Exit: 0, 1 a wrong result (or a CUDA error), 2 bad arguments, 3 below --min_ratio,
// 77 without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "ds/core/half.h"
#include "ds/optim/cuda_kernels.h"
#include "ds/optim/kernels.h"
#include "ds/precision/cuda_kernels.h"
#include "ds/precision/grad_stats.h"
#include "bench_report.h"

namespace oc = ds::optim::cuda;
namespace pc = ds::precision::cuda;
using ds::DType;
using ds::TensorView;

#define CU(call)                                                                                       \
  do {                                                                                                 \
    cudaError_t e_ = (call);                                                                           \
    if (e_ != cudaSuccess) {                                                                           \
      std::fprintf(stderr, "optim_bench_cuda: error: %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      return 1;                                                                                        \
    }                                                                                                  \
  } while (0)

namespace {

constexpr double kTarget = 0.80;
constexpr std::size_t kCheckMax = (std::size_t(1) << 22) + 3;

// Median milliseconds of `repeats` timed calls after one warm-up call.
template <class F>
float median_ms(int repeats, cudaEvent_t a, cudaEvent_t b, F&& f) {
  f();
  std::vector<float> t;
  for (int r = 0; r < repeats; ++r) {
    cudaEventRecord(a);
    f();
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The check's host inputs: master, two states (the second >= 0: Adam's v, Adagrad's sum),
// fp32 gradients and the same rounded to bf16.
struct CheckInputs {
  std::vector<float> p, s1, s2, g;
  std::vector<unsigned char> g16;
};

CheckInputs check_inputs(std::size_t k) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  CheckInputs in;
  in.p.resize(k);
  in.s1.resize(k);
  in.s2.resize(k);
  in.g.resize(k);
  for (std::size_t i = 0; i < k; ++i) {
    in.p[i] = nd(rng);
    in.s1[i] = 0.1f * nd(rng);
    in.s2[i] = 0.01f * std::fabs(nd(rng));
    in.g[i] = 0.5f * nd(rng);
  }
  in.g16.resize(k * 2);
  ds::convert(in.g.data(), DType::F32, in.g16.data(), DType::BF16, k);
  return in;
}

// Elements of `es` bytes that differ bitwise.
std::size_t diff_bits(const void* a, const void* b, std::size_t n, std::size_t es) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i)
    bad += std::memcmp(static_cast<const char*>(a) + i * es, static_cast<const char*>(b) + i * es, es) != 0;
  return bad;
}

// fp32 elements further apart than rel*|a| + abs (NaN counts as far).
std::size_t count_far(const float* a, const float* b, std::size_t n, float rel, float abs) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) bad += !(std::fabs(a[i] - b[i]) <= rel * std::fabs(a[i]) + abs);
  return bad;
}

int run(std::size_t n, int repeats, double min_ratio) {
  cudaDeviceProp prop{};
  CU(cudaGetDeviceProperties(&prop, 0));
  float *p, *m, *v, *g32, *copy_src, *copy_dst;
  void *g16, *w16;
  double* d_sumsq;
  int* d_flag;
  CU(cudaMalloc(&p, n * 4)); CU(cudaMalloc(&m, n * 4)); CU(cudaMalloc(&v, n * 4)); CU(cudaMalloc(&g32, n * 4));
  CU(cudaMalloc(&g16, n * 2)); CU(cudaMalloc(&w16, n * 2));
  CU(cudaMalloc(&copy_src, n * 20)); CU(cudaMalloc(&copy_dst, n * 20));
  CU(cudaMalloc(&d_sumsq, 8)); CU(cudaMalloc(&d_flag, 4));
  CU(cudaMemset(p, 0, n * 4)); CU(cudaMemset(m, 0, n * 4)); CU(cudaMemset(v, 0, n * 4));
  CU(cudaMemset(g32, 0, n * 4)); CU(cudaMemset(g16, 0, n * 2)); CU(cudaMemset(copy_src, 0, n * 20));
  CU(cudaMemset(d_sumsq, 0, 8)); CU(cudaMemset(d_flag, 0, 4));
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a)); CU(cudaEventCreate(&b));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("# optim_bench_cuda: %s (sm_%d%d, %d SMs), driver %d, runtime %d, %zu params, median of %d\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, driver, runtime, n, repeats);
  std::printf("| kernel | B/param | G params/s | GB/s | D2D copy GB/s (same bytes) | ratio |\n"
              "| --- | --- | --- | --- | --- | --- |\n");
  struct Case { const char* name; std::size_t bytes; DType g, w; int which; };
  const Case cases[] = {{"adamw fp32", 28, DType::F32, DType::U8, 0},
                        {"adamw bf16 grads + bf16 params", 28, DType::BF16, DType::BF16, 0},
                        {"sgd momentum fp32", 20, DType::F32, DType::U8, 1},
                        {"adagrad fp32", 20, DType::F32, DType::U8, 2},
                        {"lamb fp32 (2 passes)", 40, DType::F32, DType::U8, 3},
                        {"cast fp32 -> bf16", 6, DType::F32, DType::BF16, 4},
                        {"grad stats bf16 (norm + inf/NaN)", 2, DType::BF16, DType::U8, 5}};
  ds::optim::AdamHyper ah;
  ah.bc1 = 0.1f; ah.bc2 = 0.001f; ah.weight_decay = 0.01f;
  ds::optim::SgdHyper sh;
  sh.momentum = 0.9f;
  ds::optim::AdagradHyper gh;
  ds::optim::LambHyper lh;
  oc::LambPlan plan({}, n);
  double adamw_ratio = std::nan("");
  ds::bench::Report report("optim_bench_cuda");
  report.min_ratio(min_ratio);
  report["gpu"] = prop.name;
  report["params"] = n;
  report["repeats"] = repeats;
  report["rows"] = nlohmann::json::array();
  for (const Case& c : cases) {
    const TensorView gv{c.g == DType::F32 ? static_cast<void*>(g32) : g16, n, c.g};
    const TensorView wv{c.w == DType::U8 ? nullptr : w16, n, c.w == DType::U8 ? DType::F32 : c.w};
    const float ms = median_ms(repeats, a, b, [&] {
      switch (c.which) {
        case 0: oc::adam(p, m, v, gv, wv, n, ah, {}, nullptr); break;
        case 1: oc::sgd(p, m, gv, wv, n, sh, {}, nullptr); break;
        case 2: oc::adagrad(p, m, gv, wv, n, gh, {}, nullptr); break;
        case 3: oc::lamb(p, m, v, gv, wv, n, plan, lh, {}, nullptr); break;
        case 4: pc::cast_from_f32(p, wv, nullptr); break;
        default: pc::grad_stats(gv, d_sumsq, d_flag, nullptr); break;
      }
    });
    CU(cudaGetLastError());
    const std::size_t half = c.bytes * n / 2;
    const float cms = median_ms(repeats, a, b, [&] { cudaMemcpyAsync(copy_dst, copy_src, half, cudaMemcpyDeviceToDevice); });
    CU(cudaGetLastError());
    const double gbs = double(c.bytes) * double(n) / (ms * 1e-3) / 1e9, cgbs = double(2 * half) / (cms * 1e-3) / 1e9;
    std::printf("| %s | %zu | %.1f | %.0f | %.0f | %.2f |\n", c.name, c.bytes, double(n) / (ms * 1e-3) / 1e9, gbs, cgbs,
                gbs / cgbs);
    if (c.which == 0 && c.g == DType::F32) adamw_ratio = gbs / cgbs;
    report["rows"].push_back({{"kernel", c.name}, {"bytes_per_param", c.bytes}, {"ms", ms}, {"gb_s", gbs},
                              {"copy_gb_s", cgbs}, {"ratio", gbs / cgbs}});
  }
  CU(cudaDeviceSynchronize());
  std::printf("adamw fp32 ratio to D2D copy: %.2f (target >= %.2f): %s\n", adamw_ratio, kTarget,
              adamw_ratio >= kTarget ? "met" : "NOT met");

  // The check: one call of each kernel on random inputs, against the CPU reference.
  const std::size_t k = std::min(n, kCheckMax);
  const CheckInputs in = check_inputs(k);
  oc::LambPlan check_plan({}, k);
  std::printf("# check: each kernel once on %zu random params against the CPU reference\n", k);
  for (const Case& c : cases) {
    std::vector<float> hp = in.p, hm = in.s1, hv = in.s2, dp(k), dm(k), dv(k);
    std::vector<unsigned char> hw(k * 2, 0), dw(k * 2);
    CU(cudaMemcpy(p, hp.data(), k * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(m, hm.data(), k * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(v, hv.data(), k * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(g32, in.g.data(), k * 4, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(g16, in.g16.data(), k * 2, cudaMemcpyHostToDevice));
    CU(cudaMemset(w16, 0, k * 2));
    CU(cudaMemset(d_sumsq, 0, 8));
    CU(cudaMemset(d_flag, 0, 4));
    CU(cudaDeviceSynchronize());
    const bool has_w = c.w != DType::U8;
    const DType wview = has_w ? c.w : DType::F32;
    const TensorView gv{c.g == DType::F32 ? static_cast<void*>(g32) : g16, k, c.g};
    const TensorView wv{has_w ? w16 : nullptr, k, wview};
    const TensorView hg{const_cast<void*>(c.g == DType::F32 ? static_cast<const void*>(in.g.data())
                                                            : static_cast<const void*>(in.g16.data())),
                        k, c.g};
    const TensorView hwv{has_w ? hw.data() : nullptr, k, wview};
    float coeff = 0, dcoeff = 0;
    ds::precision::GradStats ref_stats;
    switch (c.which) {
      case 0:
        oc::adam(p, m, v, gv, wv, k, ah, {}, nullptr);
        ds::optim::adam_ref(hp.data(), hm.data(), hv.data(), hg, hwv, k, ah);
        break;
      case 1:
        oc::sgd(p, m, gv, wv, k, sh, {}, nullptr);
        ds::optim::sgd_ref(hp.data(), hm.data(), hg, hwv, k, sh);
        break;
      case 2:  // the sum of squares must be >= 0: the second state
        oc::adagrad(p, v, gv, wv, k, gh, {}, nullptr);
        ds::optim::adagrad_ref(hp.data(), hv.data(), hg, hwv, k, gh);
        break;
      case 3:
        oc::lamb(p, m, v, gv, wv, k, check_plan, lh, {}, nullptr);
        ds::optim::lamb_ref(hp.data(), hm.data(), hv.data(), hg, hwv, k, {}, lh, {&coeff, 1});
        break;
      case 4:
        pc::cast_from_f32(p, wv, nullptr);
        ds::convert(hp.data(), DType::F32, hw.data(), c.w, k);
        break;
      default:
        pc::grad_stats(gv, d_sumsq, d_flag, nullptr);
        ref_stats = ds::precision::grad_stats_ref(hg);
        break;
    }
    CU(cudaGetLastError());
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(dp.data(), p, k * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(dm.data(), m, k * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(dv.data(), v, k * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(dw.data(), w16, k * 2, cudaMemcpyDeviceToHost));
    const std::size_t wes = has_w ? ds::dtype_size(c.w) : 0;
    std::size_t bad = 0, total = 0;
    std::string how;
    if (c.which <= 2) {  // master, both states (an untouched one must stay as it was), working copy: bitwise
      bad = diff_bits(hp.data(), dp.data(), k, 4) + diff_bits(hm.data(), dm.data(), k, 4) +
            diff_bits(hv.data(), dv.data(), k, 4) + (has_w ? diff_bits(hw.data(), dw.data(), k, wes) : 0);
      total = (has_w ? 4 : 3) * k;
      how = "master, states and working copy bitwise";
    } else if (c.which == 3) {
      CU(cudaMemcpy(&dcoeff, check_plan.d_coeffs(), 4, cudaMemcpyDeviceToHost));
      bad = diff_bits(hm.data(), dm.data(), k, 4) + diff_bits(hv.data(), dv.data(), k, 4) +
            count_far(hp.data(), dp.data(), k, 2e-6f, 1e-9f) + !(std::fabs(coeff - dcoeff) <= 2e-6f * coeff);
      total = 3 * k + 1;
      how = "moments bitwise, master and trust ratio within 2e-6 relative";
    } else if (c.which == 4) {
      bad = diff_bits(hw.data(), dw.data(), k, wes);
      total = k;
      how = "bf16 copy bitwise equal to ds::convert";
    } else {
      double sum = 0;
      int flag = 0;
      CU(cudaMemcpy(&sum, d_sumsq, 8, cudaMemcpyDeviceToHost));
      CU(cudaMemcpy(&flag, d_flag, 4, cudaMemcpyDeviceToHost));
      bad = !(std::fabs(sum - ref_stats.sum_of_squares) <= 1e-12 * ref_stats.sum_of_squares) + (flag != 0);
      total = 2;
      char s[160];
      std::snprintf(s, sizeof s, "sum of squares %.17g vs %.17g (1e-12 relative), inf/NaN flag %d", sum,
                    ref_stats.sum_of_squares, flag);
      how = s;
    }
    std::printf("check %s: %zu of %zu values wrong (%s)\n", c.name, bad, total, how.c_str());
    report.check(std::string(c.name) + " vs the CPU reference", bad == 0,
                 std::to_string(bad) + " of " + std::to_string(total) + " values wrong on " + std::to_string(k) +
                     " params (" + how + ")");
  }
  report["check_params"] = k;
  report["adamw_fp32_ratio_target"] = kTarget;
  report.headline("AdamW fp32 step GB/s / D2D cudaMemcpy GB/s of the same bytes (medians, this run)", adamw_ratio);
  cudaFree(p); cudaFree(m); cudaFree(v); cudaFree(g32); cudaFree(g16); cudaFree(w16);
  cudaFree(copy_src); cudaFree(copy_dst); cudaFree(d_sumsq); cudaFree(d_flag);
  return report.finish();
}

// A positive count (digits only), else one line naming the argument and exit 2.
std::size_t parse_count(const char* what, const std::string& s) {
  char* end = nullptr;
  const unsigned long long v = s.empty() || s[0] == '-' ? 0 : std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || v == 0) {
    std::fprintf(stderr, "optim_bench_cuda: error: %s: expected a positive integer, got '%s' (usage: optim_bench_cuda "
                 "[params] [repeats] [--min_ratio X])\n", what, s.c_str());
    std::exit(2);
  }
  return std::size_t(v);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t n = 100000000;
  int repeats = 20;
  double min_ratio = 0;
  int positional = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--min_ratio") {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "optim_bench_cuda: error: --min_ratio needs a value\n");
        return 2;
      }
      min_ratio = ds::bench::parse_min_ratio("optim_bench_cuda", argv[++i]);
    } else if (arg.rfind("--", 0) != 0 && positional == 0) {
      n = parse_count("params", arg);
      ++positional;
    } else if (arg.rfind("--", 0) != 0 && positional == 1) {
      const std::size_t r = parse_count("repeats", arg);
      repeats = int(std::min<std::size_t>(r, 1000000));
      ++positional;
    } else {
      std::fprintf(stderr, "optim_bench_cuda: error: unknown argument '%s' (usage: optim_bench_cuda [params] [repeats] "
                   "[--min_ratio X])\n", arg.c_str());
      return 2;
    }
  }
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    std::printf("optim_bench_cuda: no CUDA device visible (%s): skipped\n",
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return 77;
  }
  try {
    return run(n, repeats, min_ratio);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_bench_cuda: error: %s\n", e.what());
    return 1;
  }
}
