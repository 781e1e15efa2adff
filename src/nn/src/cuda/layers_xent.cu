// CUDA softmax cross-entropy: one block per row (grid-stride over rows), fp32 online max /
// sum of exponentials per thread, then a fixed-order block combine. The backward rewrites
// the logits in place with the scaled gradient.
#include "layer_common.cuh"

namespace ds::nn::cuda {
namespace detail {

constexpr int kXentThreads = 512;
constexpr int kXentWarps = kXentThreads / kWarp;

// (m, s) represents s * exp(m) as a sum of exponentials; m == -inf means empty (s == 0).
__device__ __forceinline__ void ms_add(float& m, float& s, float v) {
  if (v > m) {
    s = s * expf(m - v) + 1.f;  // m == -inf: s == 0 and expf(-inf) == 0
    m = v;
  } else {
    s += expf(v - m);
  }
}
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) {
    m = m2;
    s = s2;
    return;
  }
  const float M = fmaxf(m, m2);
  s = s * expf(m - M) + s2 * expf(m2 - M);
  m = M;
}

template <typename T>
__global__ void crossentropy_forward_kernel(float* losses, float* lse, const T* logits, const std::int32_t* targets,
                                            std::int64_t N, std::int64_t V, bool vec) {
  __shared__ float shm[kXentWarps];
  __shared__ float shs[kXentWarps];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  for (std::int64_t r = blockIdx.x; r < N; r += gridDim.x) {  // block-uniform
    const T* x = logits + r * V;
    float m = -INFINITY, s = 0.f;
    const std::int64_t nvec = vec ? V / kVec : 0;  // vec: V % 8 == 0 and logits 16-byte aligned
    for (std::int64_t t = threadIdx.x; t < nvec; t += kXentThreads) {
      float v[kVec];
      load8(x, t * kVec, v);
#pragma unroll
      for (int k = 0; k < kVec; ++k) ms_add(m, s, v[k]);
    }
    for (std::int64_t j = nvec * kVec + threadIdx.x; j < V; j += kXentThreads) ms_add(m, s, ld(x, j));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m, o);
      const float s2 = __shfl_xor_sync(0xffffffffu, s, o);
      ms_combine(m, s, m2, s2);
    }
    if (lane == 0) {
      shm[warp] = m;
      shs[warp] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float M = -INFINITY, S = 0.f;
      for (int w = 0; w < kXentWarps; ++w) ms_combine(M, S, shm[w], shs[w]);
      const float ls = logf(S);
      const std::int64_t tg = targets[r];
      if (lse != nullptr) lse[r] = M + ls;
      // (M - x[t]) + log(S): no cancellation against a large lse.
      if (losses != nullptr) losses[r] = (tg >= 0 && tg < V) ? (M - ld(x, tg)) + ls : __int_as_float(0x7fc00000);
    }
    __syncthreads();  // shm / shs are reused by the next row
  }
}

// logits[r, j] = k * (exp(logits[r, j] - lse[r]) - (j == target[r])), k = scale / N.
template <typename T>
__global__ void crossentropy_backward_kernel(T* logits, const float* lse, const std::int32_t* targets,
                                             std::int64_t N, std::int64_t V, float k, bool vec) {
  for (std::int64_t r = blockIdx.x; r < N; r += gridDim.x) {
    T* x = logits + r * V;
    const float l = lse[r];
    const std::int64_t tg = targets[r];
    const std::int64_t nvec = vec ? V / kVec : 0;
    for (std::int64_t t = threadIdx.x; t < nvec; t += kXentThreads) {
      const std::int64_t j0 = t * kVec;
      float v[kVec];
      load8(x, j0, v);
#pragma unroll
      for (int q = 0; q < kVec; ++q) v[q] = k * (expf(v[q] - l) - (j0 + q == tg ? 1.f : 0.f));
      store8(x, j0, v);
    }
    for (std::int64_t j = nvec * kVec + threadIdx.x; j < V; j += kXentThreads)
      st(x, j, k * (expf(ld(x, j) - l) - (j == tg ? 1.f : 0.f)));
  }
}

inline unsigned xent_blocks(std::int64_t N) {
  const std::int64_t cap = 65535 * 4;
  return unsigned(N < 1 ? 1 : N > cap ? cap : N);
}

}  // namespace detail

using namespace detail;

void crossentropy_forward(float* losses, float* lse, const void* logits, const std::int32_t* targets, std::int64_t N,
                          std::int64_t V, DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && V > 0, "crossentropy_forward: bad sizes N=" << N << " V=" << V);
  if (N == 0) return;
  const bool vec = V % kVec == 0 && aligned16(logits);
  dispatch(dt, "crossentropy_forward", [&]<typename T>() {
    crossentropy_forward_kernel<T><<<xent_blocks(N), kXentThreads, 0, stream>>>(
        losses, lse, static_cast<const T*>(logits), targets, N, V, vec);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void crossentropy_backward(void* logits, const float* lse, const std::int32_t* targets, std::int64_t N,
                           std::int64_t V, float scale, DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && V > 0, "crossentropy_backward: bad sizes N=" << N << " V=" << V);
  if (N == 0) return;
  const bool vec = V % kVec == 0 && aligned16(logits);
  const float k = float(double(scale) / double(N));
  dispatch(dt, "crossentropy_backward", [&]<typename T>() {
    crossentropy_backward_kernel<T><<<xent_blocks(N), kXentThreads, 0, stream>>>(
        static_cast<T*>(logits), lse, targets, N, V, k, vec);
  });
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::nn::cuda
