// Private device helpers of the nn CUDA kernels (layers_*.cu): the dtype dispatch, fp32
// loads/stores of 1 element (8: ds/core/cuda_vec.cuh's load8 / store8, 16-byte aligned
// pointers only), warp reductions and launch sizing. Indices are int64 everywhere.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ds/core/cuda_check.h"
#include "ds/core/cuda_convert.cuh"
#include "ds/core/cuda_vec.cuh"
#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/nn/cuda_kernels.h"

namespace ds::nn::cuda::detail {

using ds::cuda::from_f;
using ds::cuda::to_f;

using ds::cuda::aligned16;
using ds::cuda::kVec;
using ds::cuda::load8;
using ds::cuda::store8;

constexpr int kThreads = 256;  // block size of the elementwise / row kernels
constexpr int kWarp = 32;

// Calls f.template operator()<T>() with the CUDA element type of dt.
template <class F>
void dispatch(DType dt, const char* who, F&& f) {
  ds::cuda::by_dtype(dt, (std::string(who) + " (CUDA)").c_str(), f);
}

// Blocks of kThreads for a grid-stride loop over `items` work items (at least 1 block).
inline unsigned blocks_for(std::int64_t items, int threads = kThreads) {
  return ds::cuda::grid_blocks(items, threads, 65535 * 4);
}

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

template <typename T>
__device__ __forceinline__ float ld(const T* p, std::int64_t i) { return to_f(p[i]); }
template <typename T>
__device__ __forceinline__ void st(T* p, std::int64_t i, float v) { p[i] = from_f<T>(v); }

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

// dst[o] += sum over c < chunks of part[c * OC + o] (one rounding), a parallel reduction in a
// fixed order. 1-D blocks of nw = blockDim.x / 32 warps (nw a power of two, at most 32); a
// block takes 32-column tiles (tile = blockIdx.x, + gridDim.x, ...; lane = column in the
// tile). Order of the sum: warp j adds the chunks c = j, j + nw, j + 2 nw, ... in increasing
// c (s_j, starting from 0.f); then the nw warp sums are combined by halving, s_j += s_{j+h}
// for h = nw/2, nw/4, ..., 1; dst[o] = round(dst[o] + s_0). The result depends on blockDim.x
// (not on gridDim.x): the same launch shape gives the same bits.
template <typename T>
__device__ __forceinline__ void reduce_chunks_add_block(T* dst, const float* part, std::int64_t chunks,
                                                        std::int64_t OC, std::int64_t first_tile,
                                                        std::int64_t tile_stride) {
  __shared__ float sh[kWarp][kWarp + 1];
  const int lane = int(threadIdx.x) % kWarp, wi = int(threadIdx.x) / kWarp, nw = int(blockDim.x) / kWarp;
  // tile is the same for the whole block: the loop and its barriers are block-uniform.
  for (std::int64_t tile = first_tile; tile * kWarp < OC; tile += tile_stride) {
    const std::int64_t o = tile * kWarp + lane;
    float s = 0.f;
    if (o < OC) {
      const float* p = part + o;
      // The loads are independent (unrolled, they are in flight together); the adds stay in order.
#pragma unroll 8
      for (std::int64_t c = wi; c < chunks; c += nw) s += p[c * OC];
    }
    sh[wi][lane] = s;
    __syncthreads();
    for (int h = nw / 2; h > 0; h >>= 1) {
      if (wi < h) sh[wi][lane] += sh[wi + h][lane];
      __syncthreads();
    }
    if (wi == 0 && o < OC) st(dst, o, ld(dst, o) + sh[0][lane]);
    __syncthreads();  // sh is rewritten by the next tile
  }
}

// Launched as <<<any grid, 1-D block of a power-of-two multiple of 32 threads (<= 1024)>>>.
template <typename T>
static __global__ void reduce_chunks_add_kernel(T* dst, const float* part, std::int64_t chunks, std::int64_t OC) {
  reduce_chunks_add_block(dst, part, chunks, OC, blockIdx.x, gridDim.x);
}

// Two reductions in one launch: blockIdx.y = 0 does (dst0, part0), 1 does (dst1, part1); a
// null dst is skipped. Grid (tiles, 2): tiles = ceil(OC / 32) gives one tile per block.
template <typename T>
static __global__ void reduce_chunks_add2_kernel(T* dst0, const float* part0, T* dst1, const float* part1,
                                                 std::int64_t chunks, std::int64_t OC) {
  T* dst = blockIdx.y == 0 ? dst0 : dst1;
  if (dst == nullptr) return;  // block-uniform
  reduce_chunks_add_block(dst, blockIdx.y == 0 ? part0 : part1, chunks, OC, blockIdx.x, gridDim.x);
}

// The launch shape the reductions want: one 32-column tile per block, 16 warps (512 threads)
// reducing it: ceil(chunks / 16) loads per thread.
constexpr int kReduceThreads = 512;

}  // namespace ds::nn::cuda::detail
