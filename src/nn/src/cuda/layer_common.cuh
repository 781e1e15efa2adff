// Private device helpers of the nn CUDA kernels (layers_*.cu): the dtype dispatch, fp32
// loads/stores of 1 or 8 elements (8: 128-bit transactions, 16-byte aligned pointers only),
// warp reductions and launch sizing. Indices are int64 everywhere.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ds/core/cuda_check.h"
#include "ds/core/cuda_convert.cuh"
#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/nn/cuda_kernels.h"

namespace ds::nn::cuda::detail {

using ds::cuda::from_f;
using ds::cuda::to_f;

constexpr int kThreads = 256;  // block size of the elementwise / row kernels
constexpr int kWarp = 32;
constexpr int kVec = 8;        // elements per 128-bit vector step (fp16/bf16: one uint4, fp32: two float4)

// Calls f.template operator()<T>() with the CUDA element type of dt.
template <class F>
void dispatch(DType dt, const char* who, F&& f) {
  switch (dt) {
    case DType::F32: return f.template operator()<float>();
    case DType::F16: return f.template operator()<__half>();
    case DType::BF16: return f.template operator()<__nv_bfloat16>();
    default: DS_THROW(who << " (CUDA): dtype must be fp32, fp16 or bf16, got " << dtype_name(dt));
  }
}

inline bool aligned16(const void* p) { return p == nullptr || (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Blocks of kThreads for a grid-stride loop over `items` work items (at least 1 block).
inline unsigned blocks_for(std::int64_t items, int threads = kThreads) {
  std::int64_t b = (items + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535 * 4) b = 65535 * 4;  // grid-stride loops cover the rest
  return unsigned(b);
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

template <typename T>
__device__ __forceinline__ float ld(const T* p, std::int64_t i) { return to_f(p[i]); }
template <typename T>
__device__ __forceinline__ void st(T* p, std::int64_t i, float v) { p[i] = from_f<T>(v); }

// 8 consecutive elements from p + i (p + i must be 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load8(const T* p, std::int64_t i, float (&r)[kVec]) {
  if constexpr (sizeof(T) == 4) {
    const float4 a = reinterpret_cast<const float4*>(p + i)[0];
    const float4 b = reinterpret_cast<const float4*>(p + i)[1];
    r[0] = a.x; r[1] = a.y; r[2] = a.z; r[3] = a.w; r[4] = b.x; r[5] = b.y; r[6] = b.z; r[7] = b.w;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(p + i);
    const T* h = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int k = 0; k < kVec; ++k) r[k] = to_f(h[k]);
  }
}
template <typename T>
__device__ __forceinline__ void store8(T* p, std::int64_t i, const float (&r)[kVec]) {
  if constexpr (sizeof(T) == 4) {
    reinterpret_cast<float4*>(p + i)[0] = make_float4(r[0], r[1], r[2], r[3]);
    reinterpret_cast<float4*>(p + i)[1] = make_float4(r[4], r[5], r[6], r[7]);
  } else {
    uint4 u;
    T* h = reinterpret_cast<T*>(&u);
#pragma unroll
    for (int k = 0; k < kVec; ++k) h[k] = from_f<T>(r[k]);
    *reinterpret_cast<uint4*>(p + i) = u;
  }
}

// Butterfly reductions: every lane ends with the result (fixed order: deterministic).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Column partial sums (bias_backward, layernorm_backward's dw/db) use blocks of
// kColX columns x kColY row lanes; the rows are cut into col_chunks(N) chunks, one partial
// row of the scratch per chunk, reduced over the chunks in a fixed order by a second kernel.
constexpr int kColX = 32;
constexpr int kColY = 8;
inline std::int64_t col_chunks(std::int64_t N) {
  std::int64_t r = ceil_div(N, 128);
  if (r < 1) r = 1;
  if (r > 64) r = 64;
  return r;
}

// dst[o] += sum over c of part[c * OC + o], c = 0 .. chunks-1 in order (one rounding).
template <typename T>
static __global__ void reduce_chunks_add_kernel(T* dst, const float* part, std::int64_t chunks, std::int64_t OC) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < OC; o += stride) {
    float s = 0.f;
    for (std::int64_t c = 0; c < chunks; ++c) s += part[c * OC + o];
    st(dst, o, ld(dst, o) + s);
  }
}

}  // namespace ds::nn::cuda::detail
