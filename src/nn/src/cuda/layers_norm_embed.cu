// CUDA LayerNorm (forward / backward) and token + position embedding (forward / backward).
// LayerNorm forward: one warp per row (fp32 two-pass mean / variance).
// LayerNorm backward, by row width:
//  - v2 (C <= 1024): one fused kernel, a grid of as many 256-thread blocks
//    as the GPU holds at once (at most 1024 and ceil(N / 8)); block b takes the contiguous rows
//    [b N / G, (b+1) N / G), its 8 warps one row at a time each. A lane holds 8 columns of every
//    256-column segment (128-bit loads when C % 8 == 0 and the pointers are 16-byte aligned,
//    guarded scalar loads otherwise): dout, inp (and dinp, loaded up front) are read once into
//    registers, dinp is written, and dw / db column sums of the block's rows stay in registers,
//    are summed over the 8 warps in order through shared memory and written once per block to
//    the scratch; then reduce_chunks_add2_kernel (layer_common.cuh) sums the G block partials
//    per column in a fixed parallel order and adds into dw / db with one rounding.
//  - v1 (C > 1024, wider than v2's registers hold): a warp-per-row dinp kernel, a
//    column-partial kernel (64 chunks of rows) re-reading dout and inp, and a serial
//    per-column reduction of the chunks.
// Both are deterministic (no float atomics); v2's dw / db bits depend on the grid size, i.e.
// on the GPU's SM count (the same GPU gives the same bits).
// Embedding backward: dwpe by a fixed-order loop over the batch; dwte through fp32 atomics
// into the caller's scratch, then one rounded add per element.
#include <cstring>
#include <type_traits>

#include "layer_common.cuh"

namespace ds::nn::cuda {
namespace detail {

constexpr float kLnEps = 1e-5f;
constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per row

// ---------------------------------------------------------------- layernorm_forward
template <typename T>
__global__ void layernorm_forward_kernel(T* out, float* mean, float* rstd, const T* inp, const T* w, const T* b,
                                         std::int64_t N, std::int64_t C) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t wstride = std::int64_t(gridDim.x) * kRowsPerBlock;
  // row is the same for the 32 lanes of a warp: the loop and the shuffles are warp-uniform.
  for (std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; row < N; row += wstride) {
    const T* x = inp + row * C;
    float s = 0.f;
    for (std::int64_t c = lane; c < C; c += kWarp) s += ld(x, c);
    const float m = warp_sum(s) / float(C);
    float v = 0.f;
    for (std::int64_t c = lane; c < C; c += kWarp) {
      const float d = ld(x, c) - m;
      v += d * d;
    }
    const float r = 1.f / sqrtf(warp_sum(v) / float(C) + kLnEps);
    T* y = out + row * C;
    for (std::int64_t c = lane; c < C; c += kWarp) st(y, c, (ld(x, c) - m) * r * ld(w, c) + ld(b, c));
    if (lane == 0) {
      if (mean != nullptr) mean[row] = m;
      if (rstd != nullptr) rstd[row] = r;
    }
  }
}

// ---------------------------------------------------------------- layernorm_backward
// dinp[row] += (w*dy - mean(w*dy) - n * mean(w*dy*n)) * rstd, n = (x - mean) * rstd.
template <typename T>
__global__ void layernorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* mean,
                                      const float* rstd, std::int64_t N, std::int64_t C) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t wstride = std::int64_t(gridDim.x) * kRowsPerBlock;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; row < N; row += wstride) {
    const T* x = inp + row * C;
    const T* dy = dout + row * C;
    const float mu = mean[row], rs = rstd[row];
    float a = 0.f, bb = 0.f;
    for (std::int64_t c = lane; c < C; c += kWarp) {
      const float wdy = ld(w, c) * ld(dy, c);
      a += wdy;
      bb += wdy * ((ld(x, c) - mu) * rs);
    }
    a = warp_sum(a) / float(C);
    bb = warp_sum(bb) / float(C);
    T* dx = dinp + row * C;
    for (std::int64_t c = lane; c < C; c += kWarp) {
      const float n = (ld(x, c) - mu) * rs;
      st(dx, c, ld(dx, c) + (ld(w, c) * ld(dy, c) - a - n * bb) * rs);
    }
  }
}

// Block (kColX, kColY), grid (ceil(C / kColX), chunks): pw[chunk, c] = sum dy * n and
// pb[chunk, c] = sum dy over the chunk's rows (fixed order).
template <typename T>
__global__ void layernorm_partial_kernel(float* pw, float* pb, const T* dout, const T* inp, const float* mean,
                                         const float* rstd, std::int64_t N, std::int64_t C,
                                         std::int64_t rows_per_chunk) {
  __shared__ float shw[kColY][kColX];
  __shared__ float shb[kColY][kColX];
  const std::int64_t c = std::int64_t(blockIdx.x) * kColX + threadIdx.x;
  const std::int64_t r0 = std::int64_t(blockIdx.y) * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float aw = 0.f, ab = 0.f;
  if (c < C)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColY) {
      const float dy = ld(dout, r * C + c);
      aw += dy * ((ld(inp, r * C + c) - mean[r]) * rstd[r]);
      ab += dy;
    }
  shw[threadIdx.y][threadIdx.x] = aw;
  shb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float sw = 0.f, sb = 0.f;
#pragma unroll
    for (int y = 0; y < kColY; ++y) {
      sw += shw[y][threadIdx.x];
      sb += shb[y][threadIdx.x];
    }
    pw[std::int64_t(blockIdx.y) * C + c] = sw;
    pb[std::int64_t(blockIdx.y) * C + c] = sb;
  }
}

// v1's reduction (kept as it was, so that v1 stays the baseline): dst[o] += sum over
// c = 0 .. chunks-1 in order of part[c * OC + o], one thread per column.
template <typename T>
__global__ void layernorm_reduce_v1_kernel(T* dst, const float* part, std::int64_t chunks, std::int64_t OC) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t o = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < OC; o += stride) {
    float s = 0.f;
    for (std::int64_t c = 0; c < chunks; ++c) s += part[c * OC + o];
    st(dst, o, ld(dst, o) + s);
  }
}

// ---------------------------------------------------------------- layernorm_backward v2
constexpr int kLnSeg = kWarp * kVec;        // columns per segment: lane l holds [l*8, l*8+8) of each
constexpr int kLnMaxK = 4;                  // segments per row in registers: C <= 1024
constexpr std::int64_t kLnMaxParts = 1024;  // most blocks (= partial rows in the scratch)

// 8 elements as their raw bits in 32-bit words (4 for fp16 / bf16: two elements a word,
// element 2i in the low half; 8 for fp32): rows stay in registers between the two passes at
// half the registers of fp32 copies (an array of 16-bit types would take a register each).
template <typename T>
struct alignas(16) Pack8 {
  static constexpr int kWords = sizeof(T) == 4 ? kVec : kVec / 2;
  unsigned u[kWords];
};

template <typename T>
__device__ __forceinline__ unsigned ln_bits(T v) {
  if constexpr (sizeof(T) == 4) return __float_as_uint(v);
  else if constexpr (std::is_same_v<T, __half>) return __half_as_ushort(v);
  else return __bfloat16_as_ushort(v);
}
template <typename T>
__device__ __forceinline__ T ln_from_bits(unsigned b) {
  if constexpr (sizeof(T) == 4) return __uint_as_float(b);
  else if constexpr (std::is_same_v<T, __half>) return __ushort_as_half(static_cast<unsigned short>(b));
  else return __ushort_as_bfloat16(static_cast<unsigned short>(b));
}
// Element k (a compile-time constant after unrolling) as fp32.
template <typename T>
__device__ __forceinline__ float pk_get(const Pack8<T>& p, int k) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(p.u[k]);
  } else {
    const unsigned w = p.u[k / 2];
    if constexpr (std::is_same_v<T, __half>) return __half2float(ln_from_bits<__half>(k % 2 == 0 ? w & 0xffffu : w >> 16));
    else return __uint_as_float(k % 2 == 0 ? w << 16 : w & 0xffff0000u);
  }
}
// Elements k, k+1 (k even) = T(lo), T(hi), rounded to nearest even (as from_f).
template <typename T>
__device__ __forceinline__ void pk_set2(Pack8<T>& p, int k, float lo, float hi) {
  if constexpr (sizeof(T) == 4) {
    p.u[k] = __float_as_uint(lo);
    p.u[k + 1] = __float_as_uint(hi);
  } else {
    p.u[k / 2] = ln_bits(from_f<T>(lo)) | (ln_bits(from_f<T>(hi)) << 16);
  }
}
template <typename T>
__device__ __forceinline__ unsigned pk_bits(const Pack8<T>& p, int k) {
  if constexpr (sizeof(T) == 4) return p.u[k];
  else return k % 2 == 0 ? p.u[k / 2] & 0xffffu : p.u[k / 2] >> 16;
}

// Columns [c0, c0 + 8) of a row; those >= C read as 0. VEC: C % 8 == 0 and p 16-byte aligned
// (so a pack is all in or all out).
template <typename T, bool VEC>
__device__ __forceinline__ Pack8<T> ln_load(const T* p, std::int64_t c0, std::int64_t C) {
  Pack8<T> r;
  if constexpr (VEC) {
    if (c0 < C) {
      const uint4* q = reinterpret_cast<const uint4*>(p + c0);
#pragma unroll
      for (int i = 0; i < Pack8<T>::kWords / 4; ++i) {
        const uint4 v = q[i];
        r.u[4 * i] = v.x; r.u[4 * i + 1] = v.y; r.u[4 * i + 2] = v.z; r.u[4 * i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < Pack8<T>::kWords; ++i) r.u[i] = 0u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < Pack8<T>::kWords; ++i) r.u[i] = 0u;
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (c0 + k < C) {
        const unsigned b = ln_bits(p[c0 + k]);
        if constexpr (sizeof(T) == 4) r.u[k] = b;
        else r.u[k / 2] |= k % 2 == 0 ? b : b << 16;
      }
  }
  return r;
}
template <typename T, bool VEC>
__device__ __forceinline__ void ln_store(T* p, std::int64_t c0, std::int64_t C, const Pack8<T>& r) {
  if constexpr (VEC) {
    if (c0 < C) {
      uint4* q = reinterpret_cast<uint4*>(p + c0);
#pragma unroll
      for (int i = 0; i < Pack8<T>::kWords / 4; ++i)
        q[i] = make_uint4(r.u[4 * i], r.u[4 * i + 1], r.u[4 * i + 2], r.u[4 * i + 3]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k)
      if (c0 + k < C) p[c0 + k] = ln_from_bits<T>(pk_bits(r, k));
  }
}

// Makes the compiler forget what p holds, so that values converted from it before are not
// kept live in fp32 (twice the registers) but converted again from the packed registers.
template <typename T>
__device__ __forceinline__ void ln_opaque(Pack8<T>& p) {
#pragma unroll
  for (int i = 0; i < Pack8<T>::kWords; ++i) asm volatile("" : "+r"(p.u[i]));
}

// Register budget: a lane keeps 4 (fp16 / bf16) or 8 (fp32) registers per segment for each of
// x, dout and dinp (w is reloaded per row: L1 hits), plus ~60 (ptxas -v: no spills at these bounds). 2 blocks = 16 warps an
// SM, each with its row's loads (4.5 KB at C = 768 bf16) in flight at once.
// (The scalar fallback, C % 8 != 0 or misaligned, needs more for K > 2: one block there.)
template <typename T, bool VEC, int K>
constexpr int ln_min_blocks() {
  return (sizeof(T) == 4 || !VEC) && K > 2 ? 1 : 2;
}
template <int K>
constexpr std::size_t ln_v2_smem() {  // dw and db accumulators: [2][8 warps][K * 256] floats
  return std::size_t(2) * kRowsPerBlock * K * kLnSeg * sizeof(float);
}

// Grid G (1-D), block kThreads, dynamic shared memory ln_v2_smem<K>(), K = ceil(C / 256) <=
// kLnMaxK. dinp may be null; pw null: no partials (pb is then unused). Otherwise
// pw[b * C + c] = sum over the block's rows of dout * xhat and pb[b * C + c] = sum of dout:
// each warp adds its rows (r0 + warp, + 8, ...) in row order into its own accumulators in
// shared memory, then the 8 warps' sums are added in order 0..7.
// Accumulator layout (bank-conflict-free float4 accesses): column s*256 + lane*8 + k of a warp
// sits at s*256 + (k/4)*128 + lane*4 + k%4.
// Long on purpose: one fused kernel whose rows, partial sums and shared-memory accumulators
// are live across its barriers; split, each piece would take them all by reference.
template <typename T, bool VEC, int K>
__global__ void __launch_bounds__(kThreads, ln_min_blocks<T, VEC, K>())
    layernorm_bwd_v2_kernel(T* dinp, float* pw, float* pb, const T* dout, const T* inp, const T* w,
                            const float* mean, const float* rstd, std::int64_t N, std::int64_t C) {
  extern __shared__ float4 ln_smem4[];
  float* const smem = reinterpret_cast<float*>(ln_smem4);
  constexpr int kRow = K * kLnSeg;  // accumulator floats per warp
  const int lane = int(threadIdx.x) % kWarp, wi = int(threadIdx.x) / kWarp;
  const bool parts = pw != nullptr;  // uniform
  float* const accw = smem + wi * kRow + lane * 4;
  float* const accb = smem + (kRowsPerBlock + wi) * kRow + lane * 4;
  const std::int64_t G = gridDim.x;
  const std::int64_t r0 = std::int64_t(blockIdx.x) * N / G, r1 = (std::int64_t(blockIdx.x) + 1) * N / G;
  if (parts) {
#pragma unroll
    for (int s = 0; s < K; ++s)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        *reinterpret_cast<float4*>(accw + s * kLnSeg + h * 128) = make_float4(0.f, 0.f, 0.f, 0.f);
        *reinterpret_cast<float4*>(accb + s * kLnSeg + h * 128) = make_float4(0.f, 0.f, 0.f, 0.f);
      }
  }
  const float inv_c = 1.f / float(C);
  // row is the same for the 32 lanes of a warp: the loop and the shuffles are warp-uniform.
  for (std::int64_t row = r0 + wi; row < r1; row += kRowsPerBlock) {
    const std::int64_t off = row * C;
    Pack8<T> xp[K], dp[K], gp[K];
#pragma unroll
    for (int s = 0; s < K; ++s) {
      const std::int64_t c0 = s * kLnSeg + lane * kVec;
      xp[s] = ln_load<T, VEC>(inp + off, c0, C);
      dp[s] = ln_load<T, VEC>(dout + off, c0, C);
      if (dinp != nullptr) gp[s] = ln_load<T, VEC>(dinp + off, c0, C);  // in flight with the others
    }
    const float mu = mean[row], rs = rstd[row];
    float a = 0.f, b = 0.f;
#pragma unroll
    for (int s = 0; s < K; ++s) {
      const Pack8<T> ws = ln_load<T, VEC>(w, s * kLnSeg + lane * kVec, C);  // L1 hits after the first row
      float tw[kVec], tb[kVec];
      if (parts) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float4 u = *reinterpret_cast<const float4*>(accw + s * kLnSeg + h * 128);
          const float4 v = *reinterpret_cast<const float4*>(accb + s * kLnSeg + h * 128);
          tw[4 * h] = u.x; tw[4 * h + 1] = u.y; tw[4 * h + 2] = u.z; tw[4 * h + 3] = u.w;
          tb[4 * h] = v.x; tb[4 * h + 1] = v.y; tb[4 * h + 2] = v.z; tb[4 * h + 3] = v.w;
        }
      }
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float n = (pk_get(xp[s], k) - mu) * rs, d = pk_get(dp[s], k);
        if (parts) {
          tw[k] += d * n;
          tb[k] += d;
        }
        const float wd = pk_get(ws, k) * d;
        a += wd;
        b += wd * n;
      }
      if (parts) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          *reinterpret_cast<float4*>(accw + s * kLnSeg + h * 128) =
              make_float4(tw[4 * h], tw[4 * h + 1], tw[4 * h + 2], tw[4 * h + 3]);
          *reinterpret_cast<float4*>(accb + s * kLnSeg + h * 128) =
              make_float4(tb[4 * h], tb[4 * h + 1], tb[4 * h + 2], tb[4 * h + 3]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < K; ++s) {  // recompute n and w*dy below instead of keeping them in fp32
      ln_opaque(xp[s]);
      ln_opaque(dp[s]);
    }
    if (dinp != nullptr) {
      a = warp_sum(a) * inv_c;
      b = warp_sum(b) * inv_c;
#pragma unroll
      for (int s = 0; s < K; ++s) {
        const Pack8<T> ws = ln_load<T, VEC>(w, s * kLnSeg + lane * kVec, C);
        Pack8<T> o;
        float t[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          const float n = (pk_get(xp[s], k) - mu) * rs, wd = pk_get(ws, k) * pk_get(dp[s], k);
          t[k] = pk_get(gp[s], k) + (wd - a - n * b) * rs;
        }
#pragma unroll
        for (int k = 0; k < kVec; k += 2) pk_set2(o, k, t[k], t[k + 1]);
        ln_store<T, VEC>(dinp + off, s * kLnSeg + lane * kVec, C, o);
      }
    }
  }
  if (!parts) return;  // block-uniform
  __syncthreads();
  float* const dw_out = pw + std::int64_t(blockIdx.x) * C;
  float* const db_out = pb + std::int64_t(blockIdx.x) * C;
  for (int c = int(threadIdx.x); c < C; c += kThreads) {
    const int cc = c % kLnSeg, l = cc / kVec, k = cc % kVec;
    const int i = (c / kLnSeg) * kLnSeg + (k / 4) * 128 + l * 4 + k % 4;
    float tw = smem[i], tb = smem[kRowsPerBlock * kRow + i];
#pragma unroll
    for (int j = 1; j < kRowsPerBlock; ++j) {
      tw += smem[j * kRow + i];
      tb += smem[(kRowsPerBlock + j) * kRow + i];
    }
    dw_out[c] = tw;
    db_out[c] = tb;
  }
}

// ---------------------------------------------------------------- embedding
// One block per row (b, t) (grid-stride over rows), threads over the channels.
template <typename T>
__global__ void embedding_forward_kernel(T* out, const std::int32_t* tokens, const T* wte, const T* wpe,
                                         std::int64_t rows, std::int64_t T_, std::int64_t C) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t tok = tokens[r];
    const T* e = wte + tok * C;
    const T* p = wpe != nullptr ? wpe + (r % T_) * C : nullptr;
    T* y = out + r * C;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) st(y, c, ld(e, c) + (p != nullptr ? ld(p, c) : 0.f));
  }
}

// dwpe[t, c] += sum over b (in order) of dout[b, t, c].
template <typename T>
__global__ void embedding_dwpe_kernel(T* dwpe, const T* dout, std::int64_t B, std::int64_t T_, std::int64_t C) {
  const std::int64_t n = T_ * C;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float s = 0.f;
    for (std::int64_t b = 0; b < B; ++b) s += ld(dout, b * n + i);
    st(dwpe, i, ld(dwpe, i) + s);
  }
}

// scratch[tok[r], c] += dout[r, c] (fp32 atomics); rows with a token outside [0, V) are skipped.
template <typename T>
__global__ void embedding_scatter_kernel(float* scratch, const T* dout, const std::int32_t* tokens,
                                         std::int64_t rows, std::int64_t C, std::int64_t V) {
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const std::int64_t tok = tokens[r];
    if (tok < 0 || tok >= V) continue;  // block-uniform
    float* dst = scratch + tok * C;
    const T* g = dout + r * C;
    for (std::int64_t c = threadIdx.x; c < C; c += blockDim.x) atomicAdd(dst + c, ld(g, c));
  }
}

template <typename T>
__global__ void add_scratch_kernel(T* dst, const float* scratch, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    st(dst, i, ld(dst, i) + scratch[i]);
}

inline unsigned row_blocks(std::int64_t rows) {
  const std::int64_t cap = 65535 * 4;
  return unsigned(rows < 1 ? 1 : rows > cap ? cap : rows);
}

}  // namespace detail

using namespace detail;

void layernorm_forward(void* out, float* mean, float* rstd, const void* inp, const void* w, const void* b,
                       std::int64_t N, std::int64_t C, DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && C > 0, "layernorm_forward: bad sizes N=" << N << " C=" << C);
  if (N == 0) return;
  const unsigned blocks = blocks_for(N, kRowsPerBlock);
  dispatch(dt, "layernorm_forward", [&]<typename T>() {
    layernorm_forward_kernel<T><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), mean, rstd,
                                                                 static_cast<const T*>(inp), static_cast<const T*>(w),
                                                                 static_cast<const T*>(b), N, C);
  });
  DS_CUDA_CHECK_LAUNCH();
}

namespace {

// v2's most blocks for N rows (at least one row per warp): the scratch holds that many partials.
std::int64_t ln_v2_max_parts(std::int64_t N) {
  const std::int64_t g = ceil_div(N, kRowsPerBlock);
  return g < 1 ? 1 : g > kLnMaxParts ? kLnMaxParts : g;
}

template <typename T>
void ln_bwd_v1(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const float* mean, const float* rstd,
               std::int64_t N, std::int64_t C, float* scratch, cudaStream_t stream) {
  const std::int64_t chunks = col_chunks(N);
  const std::int64_t rows_per_chunk = ceil_div(N, chunks);
  float* pw = scratch;
  float* pb = scratch + chunks * C;
  if (dinp != nullptr) {
    layernorm_dinp_kernel<T><<<blocks_for(N, kRowsPerBlock), kThreads, 0, stream>>>(dinp, dout, inp, w, mean, rstd,
                                                                                     N, C);
    DS_CUDA_CHECK_LAUNCH();
  }
  if (dw != nullptr || db != nullptr) {
    const dim3 grid(unsigned(ceil_div(C, kColX)), unsigned(chunks));
    layernorm_partial_kernel<T><<<grid, dim3(kColX, kColY), 0, stream>>>(pw, pb, dout, inp, mean, rstd, N, C,
                                                                          rows_per_chunk);
    DS_CUDA_CHECK_LAUNCH();
    if (dw != nullptr) {
      layernorm_reduce_v1_kernel<T><<<blocks_for(C), kThreads, 0, stream>>>(dw, pw, chunks, C);
      DS_CUDA_CHECK_LAUNCH();
    }
    if (db != nullptr) {
      layernorm_reduce_v1_kernel<T><<<blocks_for(C), kThreads, 0, stream>>>(db, pb, chunks, C);
      DS_CUDA_CHECK_LAUNCH();
    }
  }
}

template <typename T, bool VEC, int K>
void ln_bwd_v2(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const float* mean, const float* rstd,
               std::int64_t N, std::int64_t C, float* scratch, cudaStream_t stream) {
  // Blocks resident at once on the current device (one wave; the rows are split evenly).
  static const std::int64_t resident = [] {
    int dev = 0, sms = 0, per_sm = 0;
    DS_CUDA_CHECK(cudaGetDevice(&dev));
    DS_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    DS_CUDA_CHECK(cudaFuncSetAttribute(layernorm_bwd_v2_kernel<T, VEC, K>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, int(ln_v2_smem<K>())));
    DS_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, layernorm_bwd_v2_kernel<T, VEC, K>,
                                                                kThreads, ln_v2_smem<K>()));
    return std::int64_t(sms > 0 ? sms : 1) * std::int64_t(per_sm > 0 ? per_sm : 1);
  }();
  const std::int64_t cap = ln_v2_max_parts(N);
  const std::int64_t G = resident < cap ? resident : cap;
  const bool parts = dw != nullptr || db != nullptr;
  float* pw = parts ? scratch : nullptr;
  float* pb = parts ? scratch + G * C : nullptr;
  layernorm_bwd_v2_kernel<T, VEC, K><<<unsigned(G), kThreads, ln_v2_smem<K>(), stream>>>(dinp, pw, pb, dout, inp, w, mean, rstd,
                                                                           N, C);
  DS_CUDA_CHECK_LAUNCH();
  if (parts) {
    reduce_chunks_add2_kernel<T><<<dim3(unsigned(ceil_div(C, kWarp)), 2), kReduceThreads, 0, stream>>>(
        dw, pw, db, pb, G, C);
    DS_CUDA_CHECK_LAUNCH();
  }
}

template <typename T, bool VEC>
void ln_bwd_v2_k(T* dinp, T* dw, T* db, const T* dout, const T* inp, const T* w, const float* mean,
                 const float* rstd, std::int64_t N, std::int64_t C, float* scratch, cudaStream_t stream) {
  switch (ceil_div(C, kLnSeg)) {
    case 1: return ln_bwd_v2<T, VEC, 1>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, stream);
    case 2: return ln_bwd_v2<T, VEC, 2>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, stream);
    case 3: return ln_bwd_v2<T, VEC, 3>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, stream);
    default: return ln_bwd_v2<T, VEC, 4>(dinp, dw, db, dout, inp, w, mean, rstd, N, C, scratch, stream);
  }
}

}  // namespace

// v1 needs 2 * col_chunks(N) * C floats, v2 2 * ln_v2_max_parts(N) * C (col_chunks(N) <= 64
// and <= ceil(N / 128) <= ln_v2_max_parts(N)): the larger serves both.
std::size_t layernorm_scratch_floats(std::int64_t N, std::int64_t C) {
  if (C <= 0) return 0;
  const std::int64_t v1 = col_chunks(N), v2 = ln_v2_max_parts(N);
  return std::size_t(2 * (v1 > v2 ? v1 : v2) * C);
}

void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, std::int64_t N, std::int64_t C, float* scratch,
                        DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && C > 0, "layernorm_backward: bad sizes N=" << N << " C=" << C);
  if (N == 0 || (dinp == nullptr && dw == nullptr && db == nullptr)) return;
  DS_CHECK(scratch != nullptr || (dw == nullptr && db == nullptr), "layernorm_backward: null scratch");
  const bool v2 = C <= std::int64_t(kLnMaxK) * kLnSeg;
  const bool vec = C % kVec == 0 && aligned16(dinp) && aligned16(dout) && aligned16(inp) && aligned16(w);
  dispatch(dt, "layernorm_backward", [&]<typename T>() {
    T* gx = static_cast<T*>(dinp);
    T* gw = static_cast<T*>(dw);
    T* gb = static_cast<T*>(db);
    const T* dy = static_cast<const T*>(dout);
    const T* x = static_cast<const T*>(inp);
    const T* wt = static_cast<const T*>(w);
    if (!v2)
      ln_bwd_v1<T>(gx, gw, gb, dy, x, wt, mean, rstd, N, C, scratch, stream);
    else if (vec)
      ln_bwd_v2_k<T, true>(gx, gw, gb, dy, x, wt, mean, rstd, N, C, scratch, stream);
    else
      ln_bwd_v2_k<T, false>(gx, gw, gb, dy, x, wt, mean, rstd, N, C, scratch, stream);
  });
}

void embedding_forward(void* out, const std::int32_t* tokens, const void* wte, const void* wpe, std::int64_t B,
                       std::int64_t T, std::int64_t C, DType dt, cudaStream_t stream) {
  DS_CHECK(B >= 0 && T >= 0 && C >= 0, "embedding_forward: bad sizes B=" << B << " T=" << T << " C=" << C);
  const std::int64_t rows = B * T;
  if (rows == 0 || C == 0) return;
  dispatch(dt, "embedding_forward", [&]<typename Tp>() {
    embedding_forward_kernel<Tp><<<row_blocks(rows), kThreads, 0, stream>>>(
        static_cast<Tp*>(out), tokens, static_cast<const Tp*>(wte), static_cast<const Tp*>(wpe), rows, T, C);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void embedding_backward(void* dwte, void* dwpe, const void* dout, const std::int32_t* tokens, std::int64_t B,
                        std::int64_t T, std::int64_t C, std::int64_t V, float* scratch, DType dt,
                        cudaStream_t stream) {
  DS_CHECK(B >= 0 && T >= 0 && C >= 0 && V >= 0,
           "embedding_backward: bad sizes B=" << B << " T=" << T << " C=" << C << " V=" << V);
  const std::int64_t rows = B * T;
  if (rows == 0 || C == 0) return;
  dispatch(dt, "embedding_backward", [&]<typename Tp>() {
    if (dwpe != nullptr) {
      embedding_dwpe_kernel<Tp><<<blocks_for(T * C), kThreads, 0, stream>>>(static_cast<Tp*>(dwpe),
                                                                             static_cast<const Tp*>(dout), B, T, C);
      DS_CUDA_CHECK_LAUNCH();
    }
    if (dwte != nullptr && V > 0) {
      DS_CHECK(scratch != nullptr, "embedding_backward: null scratch");
      DS_CUDA_CHECK(cudaMemsetAsync(scratch, 0, std::size_t(V * C) * sizeof(float), stream));
      embedding_scatter_kernel<Tp><<<row_blocks(rows), kThreads, 0, stream>>>(scratch, static_cast<const Tp*>(dout),
                                                                              tokens, rows, C, V);
      DS_CUDA_CHECK_LAUNCH();
      add_scratch_kernel<Tp><<<blocks_for(V * C), kThreads, 0, stream>>>(static_cast<Tp*>(dwte), scratch, V * C);
      DS_CUDA_CHECK_LAUNCH();
    }
  });
}

}  // namespace ds::nn::cuda
