// GPU optimizer-kernel benchmark (not a test; needs a GPU, exits 77 without one): the CUDA
// Adam/AdamW, SGD, Adagrad and Lamb kernels in GB/s as a ratio to a device-to-device copy
// moving the same bytes (cudaMemcpyAsync of bytes/2: it reads and writes them), measured in
// the same run with CUDA events; median of repeats after a warm-up.
// Usage: optim_bench_cuda [params=100000000] [repeats=20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ds/optim/cuda_kernels.h"

namespace oc = ds::optim::cuda;
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

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("optim_bench_cuda: no CUDA device visible\n");
    return 77;
  }
  const std::size_t n = argc > 1 ? std::stoull(argv[1]) : 100000000ull;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 20;
  cudaDeviceProp prop{};
  CU(cudaGetDeviceProperties(&prop, 0));
  float *p, *m, *v, *g32, *copy_src, *copy_dst;
  void *g16, *w16;
  CU(cudaMalloc(&p, n * 4)); CU(cudaMalloc(&m, n * 4)); CU(cudaMalloc(&v, n * 4)); CU(cudaMalloc(&g32, n * 4));
  CU(cudaMalloc(&g16, n * 2)); CU(cudaMalloc(&w16, n * 2));
  CU(cudaMalloc(&copy_src, n * 20)); CU(cudaMalloc(&copy_dst, n * 20));
  CU(cudaMemset(p, 0, n * 4)); CU(cudaMemset(m, 0, n * 4)); CU(cudaMemset(v, 0, n * 4));
  CU(cudaMemset(g32, 0, n * 4)); CU(cudaMemset(g16, 0, n * 2)); CU(cudaMemset(copy_src, 0, n * 20));
  cudaEvent_t a, b;
  CU(cudaEventCreate(&a)); CU(cudaEventCreate(&b));
  std::printf("# %s, %zu params, median of %d\n", prop.name, n, repeats);
  std::printf("| kernel | B/param | G params/s | GB/s | D2D copy GB/s (same bytes) | ratio |\n| --- | --- | --- | --- | --- | --- |\n");
  struct Case { const char* name; std::size_t bytes; DType g, w; int which; };
  const Case cases[] = {{"adamw fp32", 28, DType::F32, DType::U8, 0},  {"adamw bf16 grads+params", 28, DType::BF16, DType::BF16, 0},
                        {"sgd momentum fp32", 20, DType::F32, DType::U8, 1}, {"adagrad fp32", 20, DType::F32, DType::U8, 2},
                        {"lamb fp32 (2 passes)", 40, DType::F32, DType::U8, 3}};
  ds::optim::AdamHyper ah;
  ah.bc1 = 0.1f; ah.bc2 = 0.001f; ah.weight_decay = 0.01f;
  ds::optim::SgdHyper sh;
  sh.momentum = 0.9f;
  ds::optim::AdagradHyper gh;
  ds::optim::LambHyper lh;
  oc::LambPlan plan({}, n);
  for (const Case& c : cases) {
    const TensorView gv{c.g == DType::F32 ? static_cast<void*>(g32) : g16, n, c.g};
    const TensorView wv{c.w == DType::U8 ? nullptr : w16, n, c.w == DType::U8 ? DType::F32 : c.w};
    const float ms = median_ms(repeats, a, b, [&] {
      switch (c.which) {
        case 0: oc::adam(p, m, v, gv, wv, n, ah, {}, nullptr); break;
        case 1: oc::sgd(p, m, gv, wv, n, sh, {}, nullptr); break;
        case 2: oc::adagrad(p, m, gv, wv, n, gh, {}, nullptr); break;
        default: oc::lamb(p, m, v, gv, wv, n, plan, lh, {}, nullptr); break;
      }
    });
    const std::size_t half = c.bytes * n / 2;
    const float cms = median_ms(repeats, a, b, [&] { cudaMemcpyAsync(copy_dst, copy_src, half, cudaMemcpyDeviceToDevice); });
    CU(cudaGetLastError());
    const double gbs = double(c.bytes) * double(n) / (ms * 1e-3) / 1e9, cgbs = double(2 * half) / (cms * 1e-3) / 1e9;
    std::printf("| %s | %zu | %.1f | %.0f | %.0f | %.2f |\n", c.name, c.bytes, double(n) / (ms * 1e-3) / 1e9, gbs, cgbs, gbs / cgbs);
  }
  return 0;
}
