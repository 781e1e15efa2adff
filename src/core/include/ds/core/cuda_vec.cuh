// Device-side vector helpers shared by every CUDA kernel (nn layers, optimizers, precision):
// fp32 / fp16 / bf16 loads and stores of 8 elements as 128-bit transactions, the alignment
// test they need, the dtype dispatch and the grid size of a grid-stride loop. One copy, so
// the kernels read and round alike.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ds/core/cuda_convert.cuh"
#include "ds/core/dtype.h"
#include "ds/core/error.h"

namespace ds::cuda {

constexpr int kVec = 8;  // elements per 128-bit vector step (fp16/bf16: one uint4, fp32: two float4)

// 8 consecutive elements from p + i as fp32 (p + i must be 16-byte aligned).
template <typename T, typename I>
__device__ __forceinline__ void load8(const T* p, I i, float (&r)[kVec]) {
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

// 8 fp32 values rounded to T into p + i (16-byte aligned).
template <typename T, typename I>
__device__ __forceinline__ void store8(T* p, I i, const float (&r)[kVec]) {
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

// Whether p may take load8 / store8 (null counts as aligned: an absent array).
inline bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

// Blocks of `threads` for a grid-stride loop over `items` work items: at least 1, at most
// max_blocks (the loop covers the rest).
inline unsigned grid_blocks(std::int64_t items, int threads, std::int64_t max_blocks) {
  std::int64_t b = (items + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return unsigned(b);
}

// Calls f.template operator()<T>() with the CUDA element type of dt; other dtypes throw
// "<who>: dtype must be fp32, fp16 or bf16, got <dt>".
template <class F>
void by_dtype(DType dt, const char* who, F&& f) {
  switch (dt) {
    case DType::F32: return f.template operator()<float>();
    case DType::F16: return f.template operator()<__half>();
    case DType::BF16: return f.template operator()<__nv_bfloat16>();
    default: DS_THROW(who << ": dtype must be fp32, fp16 or bf16, got " << dtype_name(dt));
  }
}

}  // namespace ds::cuda
