// GPU optimizer-kernel benchmark (not a test; needs a GPU, exits 77 without one): the CUDA
// Adam/AdamW, SGD, Adagrad and Lamb kernels and the precision kernels (fp32 -> bf16 cast,
// grad stats) in GB/s as a ratio to a device-to-device copy moving the same bytes
// (cudaMemcpyAsync of bytes/2: it reads and writes them), measured in the same run with
// CUDA events; median of repeats after a warm-up. "B/param" counts every byte a kernel must
// read or write once per parameter (AdamW fp32: p, m, v, g read + p, m, v written = 28).
// The target: AdamW at >= 0.80 of the copy; the last line says whether it holds.
// Usage: optim_bench_cuda [params=100000000] [repeats=20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "ds/optim/cuda_kernels.h"
#include "ds/precision/cuda_kernels.h"

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

int run(std::size_t n, int repeats) {
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
  double adamw_ratio = 0.0;
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
  }
  CU(cudaDeviceSynchronize());
  std::printf("adamw fp32 ratio to D2D copy: %.2f (target >= %.2f): %s\n", adamw_ratio, kTarget,
              adamw_ratio >= kTarget ? "met" : "NOT met");
  cudaFree(p); cudaFree(m); cudaFree(v); cudaFree(g32); cudaFree(g16); cudaFree(w16);
  cudaFree(copy_src); cudaFree(copy_dst); cudaFree(d_sumsq); cudaFree(d_flag);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    std::printf("optim_bench_cuda: no CUDA device visible (%s)\n", rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return 77;
  }
  try {
    const std::size_t n = argc > 1 ? std::stoull(argv[1]) : 100000000ull;
    const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
    if (n == 0 || repeats < 1) {
      std::fprintf(stderr, "optim_bench_cuda: error: usage: optim_bench_cuda [params>0] [repeats>0]\n");
      return 2;
    }
    return run(n, repeats);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "optim_bench_cuda: error: %s\n", e.what());
    return 1;
  }
}
