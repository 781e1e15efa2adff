// Shared helpers of the tests/cuda binaries (plain executables, no GoogleTest; bench/gpu_check.sh
// runs them on a GPU machine).
// Exit codes: 0 pass, 1 failure, 77 no GPU visible (ctest SKIP_RETURN_CODE).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "ds/core/half.h"

namespace cuda_test {

inline int g_failures = 0;

// Returns 77 (after saying why) when no CUDA device is visible, else 0.
inline int skip_without_gpu(const char* prog) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0) {
    std::printf("%s: no CUDA device visible (%s): skipped\n", prog,
                rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices");
    return 77;
  }
  return 0;
}

inline int finish(const char* prog) {
  if (g_failures) {
    std::printf("%s: %d failure(s)\n", prog, g_failures);
    return 1;
  }
  std::printf("%s: all checks passed\n", prog);
  return 0;
}

// A device copy of a host byte buffer (zeros when host is null), `offset` bytes into a fresh
// allocation (offset 4 breaks 16-byte alignment and exercises the scalar paths). Complete
// on the device when the constructor / from_host returns.
struct Dev {
  void* base = nullptr;
  char* ptr = nullptr;
  std::size_t bytes = 0;
  Dev(const void* host, std::size_t nbytes, std::size_t offset = 0);
  ~Dev() { cudaFree(base); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <typename T> T* as() { return reinterpret_cast<T*>(ptr); }
  void to_host(void* host) const;
  void from_host(const void* host);
};

inline std::vector<float> randv(std::size_t n, unsigned seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = scale * nd(rng);
  return v;
}

inline std::vector<unsigned char> to_dtype(const std::vector<float>& v, ds::DType t) {
  std::vector<unsigned char> b(v.size() * ds::dtype_size(t));
  ds::convert(v.data(), ds::DType::F32, b.data(), t, v.size());
  return b;
}

inline bool same(const void* a, const void* b, std::size_t bytes) { return bytes == 0 || std::memcmp(a, b, bytes) == 0; }

// Elements of a and b (fp32) further apart than rel*|a| + abs.
inline std::size_t count_far(const float* a, const float* b, std::size_t n, float rel, float abs) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
    const float m = a[i] < 0 ? -a[i] : a[i];
    bad += !(d <= rel * m + abs);  // NaN counts as far
  }
  return bad;
}

}  // namespace cuda_test

#define EXPECT(cond, ...)                                                    \
  do {                                                                       \
    if (!(cond)) {                                                           \
      ++cuda_test::g_failures;                                               \
      std::fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
      std::fprintf(stderr, __VA_ARGS__);                                     \
      std::fprintf(stderr, "\n");                                            \
    }                                                                        \
  } while (0)

#define CU(call)                                                                                      \
  do {                                                                                                \
    cudaError_t e_ = (call);                                                                          \
    if (e_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(e_), __FILE__, __LINE__, #call); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace cuda_test {
inline Dev::Dev(const void* host, std::size_t nbytes, std::size_t offset) : bytes(nbytes) {
  CU(cudaMalloc(&base, nbytes + offset + 16));
  ptr = static_cast<char*>(base) + offset;
  if (nbytes && host) CU(cudaMemcpy(ptr, host, nbytes, cudaMemcpyHostToDevice));
  if (nbytes && !host) CU(cudaMemset(ptr, 0, nbytes));
  // cudaMemset is asynchronous and a pageable cudaMemcpy may return before its DMA lands;
  // both are ordered on the legacy stream only, which a non-blocking stream ignores.
  CU(cudaDeviceSynchronize());
}
inline void Dev::to_host(void* host) const {
  if (bytes) CU(cudaMemcpy(host, ptr, bytes, cudaMemcpyDeviceToHost));
}
inline void Dev::from_host(const void* host) {
  if (bytes) CU(cudaMemcpy(ptr, host, bytes, cudaMemcpyHostToDevice));
  CU(cudaDeviceSynchronize());
}
}  // namespace cuda_test
