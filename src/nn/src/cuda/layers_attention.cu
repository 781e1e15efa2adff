// CUDA attention helpers: the qkv / head layout permutations (bit copies, any dtype) and the
// causal softmax forward / backward (one warp per row; only j <= i is read, j > i written 0).
#include <initializer_list>

#include "attention_blocks.h"
#include "layer_common.cuh"

namespace ds::nn::cuda {
namespace detail {

// The index map of the layouts: element i of a [B, NH, T, hs] tensor lives at
// (b*T + t) * row + h*hs + d of the [B, T, row] tensor (row = C, or 3C for qkv).
struct HeadIndex {
  std::int64_t T, NH, hs, row;
  __device__ __forceinline__ std::int64_t operator()(std::int64_t i) const {
    const std::int64_t d = i % hs;
    std::int64_t rest = i / hs;
    const std::int64_t t = rest % T;
    rest /= T;
    const std::int64_t h = rest % NH;
    const std::int64_t b = rest / NH;
    return (b * T + t) * row + h * hs + d;
  }
};

// Bit copies: U = uint32_t (fp32) or uint16_t (fp16 / bf16).
template <typename U>
__global__ void split_qkv_kernel(U* q, U* k, U* v, const U* qkv, std::int64_t n, std::int64_t C, HeadIndex hi) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t s = hi(i);
    q[i] = qkv[s];
    k[i] = qkv[s + C];
    v[i] = qkv[s + 2 * C];
  }
}

template <typename U>
__global__ void merge_qkv_kernel(U* dqkv, const U* dq, const U* dk, const U* dv, std::int64_t n, std::int64_t C,
                                 HeadIndex hi) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const std::int64_t s = hi(i);
    dqkv[s] = dq[i];
    dqkv[s + C] = dk[i];
    dqkv[s + 2 * C] = dv[i];
  }
}

// to_heads: yh[i] = y[hi(i)]; else y[hi(i)] = yh[i].
template <typename U, bool to_heads>
__global__ void heads_kernel(U* dst, const U* src, std::int64_t n, HeadIndex hi) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    if constexpr (to_heads) dst[i] = src[hi(i)];
    else dst[hi(i)] = src[i];
  }
}

// Fast path of the four layout kernels (the per-element kernels above did four 64-bit
// divisions per 2-byte element: 0.17 ms for split_qkv at the GPT-2 124M shape, 0.22 of copy
// bandwidth on an H200): 16-byte units (8 bf16 / fp16, 4 fp32), 32-bit index arithmetic.
// Needs hs a whole number of units, 16-byte aligned pointers and < 2^32 units; else the
// per-element kernels run. Unit u of a [B, NH, T, hs] tensor lives at unit
// (b*T + t) * row_u + h*hs_u + du of the [B, T, row] tensor.
struct UnitIndex {
  unsigned T, NH, hs_u, row_u;
  __device__ __forceinline__ std::size_t operator()(unsigned u) const {
    const unsigned du = u % hs_u;
    unsigned rest = u / hs_u;
    const unsigned t = rest % T;
    rest /= T;
    const unsigned h = rest % NH;
    const unsigned b = rest / NH;
    return (std::size_t(b) * T + t) * row_u + std::size_t(h) * hs_u + du;
  }
};

__global__ void split_qkv_vec_kernel(uint4* q, uint4* k, uint4* v, const uint4* qkv, unsigned n_units, unsigned C_u,
                                     UnitIndex ui) {
  const unsigned stride = gridDim.x * blockDim.x;
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < n_units; u += stride) {
    const std::size_t s = ui(u);
    q[u] = qkv[s];
    k[u] = qkv[s + C_u];
    v[u] = qkv[s + 2 * std::size_t(C_u)];
  }
}

__global__ void merge_qkv_vec_kernel(uint4* dqkv, const uint4* dq, const uint4* dk, const uint4* dv, unsigned n_units,
                                     unsigned C_u, UnitIndex ui) {
  const unsigned stride = gridDim.x * blockDim.x;
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < n_units; u += stride) {
    const std::size_t s = ui(u);
    dqkv[s] = dq[u];
    dqkv[s + C_u] = dk[u];
    dqkv[s + 2 * std::size_t(C_u)] = dv[u];
  }
}

template <bool to_heads>
__global__ void heads_vec_kernel(uint4* dst, const uint4* src, unsigned n_units, UnitIndex ui) {
  const unsigned stride = gridDim.x * blockDim.x;
  for (unsigned u = blockIdx.x * blockDim.x + threadIdx.x; u < n_units; u += stride) {
    if constexpr (to_heads) dst[u] = src[ui(u)];
    else dst[ui(u)] = src[u];
  }
}

// The unit index for row = row_mult * C, or nothing when the fast path does not apply.
inline bool unit_index(DType dt, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, std::int64_t row_mult,
                       std::initializer_list<const void*> ptrs, UnitIndex& ui, unsigned& n_units, unsigned& C_u) {
  const std::int64_t per = 16 / std::int64_t(dtype_size(dt));  // elements per unit
  const std::int64_t hs = C / NH;
  if (hs % per != 0) return false;
  for (const void* p : ptrs)
    if (!aligned16(p)) return false;
  const std::int64_t units = B * T * C / per;
  if (units >= (std::int64_t(1) << 32) || T >= (std::int64_t(1) << 32)) return false;
  ui = UnitIndex{unsigned(T), unsigned(NH), unsigned(hs / per), unsigned(row_mult * C / per)};
  n_units = unsigned(units);
  C_u = unsigned(C / per);
  return true;
}

// Calls f.template operator()<U>() with the unsigned type of dt's size.
template <class F>
void dispatch_bits(DType dt, const char* who, F&& f) {
  switch (dt) {
    case DType::F32: return f.template operator()<std::uint32_t>();
    case DType::F16:
    case DType::BF16: return f.template operator()<std::uint16_t>();
    default: DS_THROW(who << " (CUDA): dtype must be fp32, fp16 or bf16, got " << dtype_name(dt));
  }
}

inline void check_heads(const char* who, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH) {
  DS_CHECK(B >= 0 && T >= 0 && C >= 0 && NH > 0 && C % NH == 0,
           who << ": bad sizes B=" << B << " T=" << T << " C=" << C << " NH=" << NH << " (C % NH must be 0)");
}

// ---------------------------------------------------------------- causal softmax
constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per row

// fill_block > 0: the zeros above the diagonal go only up to the end of the row's block of
// fill_block rows (min(T, (i / fill_block + 1) * fill_block)), all a block-causal product reads.
template <typename T>
__global__ void causal_softmax_forward_kernel(T* att, const T* scores, float scale, std::int64_t rows,
                                              std::int64_t Tn, std::int64_t fill_block) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t wstride = std::int64_t(gridDim.x) * kRowsPerBlock;
  // row is warp-uniform: the loop and the shuffles are too.
  for (std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; row < rows;
       row += wstride) {
    const std::int64_t i = row % Tn;
    const T* s = scores + row * Tn;
    T* a = att + row * Tn;  // may alias s: each element is read, then written, by one lane
    float m = -INFINITY;
    for (std::int64_t j = lane; j <= i; j += kWarp) m = fmaxf(m, scale * ld(s, j));
    m = warp_max(m);
    float sum = 0.f;
    for (std::int64_t j = lane; j <= i; j += kWarp) sum += expf(scale * ld(s, j) - m);
    const float inv = 1.f / warp_sum(sum);
    for (std::int64_t j = lane; j <= i; j += kWarp) st(a, j, expf(scale * ld(s, j) - m) * inv);
    const std::int64_t fill_end = fill_block > 0 && (i / fill_block + 1) * fill_block < Tn ? (i / fill_block + 1) * fill_block : Tn;
    for (std::int64_t j = i + 1 + lane; j < fill_end; j += kWarp) st(a, j, 0.f);
  }
}

template <typename T>
__global__ void causal_softmax_backward_kernel(T* dscores, const T* att, const T* datt, float scale,
                                               std::int64_t rows, std::int64_t Tn, std::int64_t fill_block) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t wstride = std::int64_t(gridDim.x) * kRowsPerBlock;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; row < rows;
       row += wstride) {
    const std::int64_t i = row % Tn;
    const T* p = att + row * Tn;
    const T* dp = datt + row * Tn;
    T* ds = dscores + row * Tn;  // may alias dp: each element is read, then written, by one lane
    float dot = 0.f;
    for (std::int64_t j = lane; j <= i; j += kWarp) dot += ld(p, j) * ld(dp, j);
    dot = warp_sum(dot);
    for (std::int64_t j = lane; j <= i; j += kWarp) st(ds, j, scale * ld(p, j) * (ld(dp, j) - dot));
    const std::int64_t fill_end = fill_block > 0 && (i / fill_block + 1) * fill_block < Tn ? (i / fill_block + 1) * fill_block : Tn;
    for (std::int64_t j = i + 1 + lane; j < fill_end; j += kWarp) st(ds, j, 0.f);
  }
}

}  // namespace detail

using namespace detail;

void split_qkv(void* q, void* k, void* v, const void* qkv, std::int64_t B, std::int64_t T, std::int64_t C,
               std::int64_t NH, DType dt, cudaStream_t stream) {
  check_heads("split_qkv", B, T, C, NH);
  const std::int64_t n = B * T * C;
  if (n == 0) return;
  UnitIndex ui;
  unsigned nu = 0, cu = 0;
  if (unit_index(dt, B, T, C, NH, 3, {q, k, v, qkv}, ui, nu, cu)) {
    split_qkv_vec_kernel<<<blocks_for(nu), kThreads, 0, stream>>>(static_cast<uint4*>(q), static_cast<uint4*>(k),
                                                                   static_cast<uint4*>(v), static_cast<const uint4*>(qkv),
                                                                   nu, cu, ui);
    DS_CUDA_CHECK_LAUNCH();
    return;
  }
  const HeadIndex hi{T, NH, C / NH, 3 * C};
  dispatch_bits(dt, "split_qkv", [&]<typename U>() {
    split_qkv_kernel<U><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<U*>(q), static_cast<U*>(k),
                                                                 static_cast<U*>(v), static_cast<const U*>(qkv), n, C, hi);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void merge_qkv(void* dqkv, const void* dq, const void* dk, const void* dv, std::int64_t B, std::int64_t T,
               std::int64_t C, std::int64_t NH, DType dt, cudaStream_t stream) {
  check_heads("merge_qkv", B, T, C, NH);
  const std::int64_t n = B * T * C;
  if (n == 0) return;
  UnitIndex ui;
  unsigned nu = 0, cu = 0;
  if (unit_index(dt, B, T, C, NH, 3, {dqkv, dq, dk, dv}, ui, nu, cu)) {
    merge_qkv_vec_kernel<<<blocks_for(nu), kThreads, 0, stream>>>(static_cast<uint4*>(dqkv), static_cast<const uint4*>(dq),
                                                                   static_cast<const uint4*>(dk),
                                                                   static_cast<const uint4*>(dv), nu, cu, ui);
    DS_CUDA_CHECK_LAUNCH();
    return;
  }
  const HeadIndex hi{T, NH, C / NH, 3 * C};
  dispatch_bits(dt, "merge_qkv", [&]<typename U>() {
    merge_qkv_kernel<U><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<U*>(dqkv), static_cast<const U*>(dq),
                                                                 static_cast<const U*>(dk), static_cast<const U*>(dv),
                                                                 n, C, hi);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void merge_heads(void* y, const void* yh, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, DType dt,
                 cudaStream_t stream) {
  check_heads("merge_heads", B, T, C, NH);
  const std::int64_t n = B * T * C;
  if (n == 0) return;
  UnitIndex ui;
  unsigned nu = 0, cu = 0;
  if (unit_index(dt, B, T, C, NH, 1, {y, yh}, ui, nu, cu)) {
    heads_vec_kernel<false><<<blocks_for(nu), kThreads, 0, stream>>>(static_cast<uint4*>(y),
                                                                      static_cast<const uint4*>(yh), nu, ui);
    DS_CUDA_CHECK_LAUNCH();
    return;
  }
  const HeadIndex hi{T, NH, C / NH, C};
  dispatch_bits(dt, "merge_heads", [&]<typename U>() {
    heads_kernel<U, false><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<U*>(y), static_cast<const U*>(yh), n, hi);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void split_heads(void* yh, const void* y, std::int64_t B, std::int64_t T, std::int64_t C, std::int64_t NH, DType dt,
                 cudaStream_t stream) {
  check_heads("split_heads", B, T, C, NH);
  const std::int64_t n = B * T * C;
  if (n == 0) return;
  UnitIndex ui;
  unsigned nu = 0, cu = 0;
  if (unit_index(dt, B, T, C, NH, 1, {yh, y}, ui, nu, cu)) {
    heads_vec_kernel<true><<<blocks_for(nu), kThreads, 0, stream>>>(static_cast<uint4*>(yh),
                                                                     static_cast<const uint4*>(y), nu, ui);
    DS_CUDA_CHECK_LAUNCH();
    return;
  }
  const HeadIndex hi{T, NH, C / NH, C};
  dispatch_bits(dt, "split_heads", [&]<typename U>() {
    heads_kernel<U, true><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<U*>(yh), static_cast<const U*>(y), n, hi);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void causal_softmax_forward(void* att, const void* scores, float scale, std::int64_t BNH, std::int64_t T, DType dt,
                            cudaStream_t stream) {
  causal_softmax_forward_blocks(att, scores, scale, BNH, T, 0, dt, stream);
}

void causal_softmax_forward_blocks(void* att, const void* scores, float scale, std::int64_t BNH, std::int64_t T,
                                   std::int64_t fill_block, DType dt, cudaStream_t stream) {
  DS_CHECK(BNH >= 0 && T >= 0 && fill_block >= 0,
           "causal_softmax_forward: bad sizes BNH=" << BNH << " T=" << T << " fill_block=" << fill_block);
  const std::int64_t rows = BNH * T;
  if (rows == 0) return;
  dispatch(dt, "causal_softmax_forward", [&]<typename Tp>() {
    causal_softmax_forward_kernel<Tp><<<blocks_for(rows, kRowsPerBlock), kThreads, 0, stream>>>(
        static_cast<Tp*>(att), static_cast<const Tp*>(scores), scale, rows, T, fill_block);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(void* dscores, const void* att, const void* datt, float scale, std::int64_t BNH,
                             std::int64_t T, DType dt, cudaStream_t stream) {
  causal_softmax_backward_blocks(dscores, att, datt, scale, BNH, T, 0, dt, stream);
}

void causal_softmax_backward_blocks(void* dscores, const void* att, const void* datt, float scale, std::int64_t BNH,
                                    std::int64_t T, std::int64_t fill_block, DType dt, cudaStream_t stream) {
  DS_CHECK(BNH >= 0 && T >= 0 && fill_block >= 0,
           "causal_softmax_backward: bad sizes BNH=" << BNH << " T=" << T << " fill_block=" << fill_block);
  const std::int64_t rows = BNH * T;
  if (rows == 0) return;
  dispatch(dt, "causal_softmax_backward", [&]<typename Tp>() {
    causal_softmax_backward_kernel<Tp><<<blocks_for(rows, kRowsPerBlock), kThreads, 0, stream>>>(
        static_cast<Tp*>(dscores), static_cast<const Tp*>(att), static_cast<const Tp*>(datt), scale, rows, T, fill_block);
  });
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::nn::cuda
