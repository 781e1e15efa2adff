// Causal flash attention (FlashAttention-2 style), see ds/nn/cuda_flash.h. Tensor-core
// products through the WMMA API (16x16x16 fragments of fp16/bf16, fp32 accumulators; sm_80+);
// every fragment goes through shared memory, and the row-wise work (masking, online softmax,
// rescaling, dS) runs on fp32 tiles there, because the register layout of a fragment is opaque.
//
// Tiles: 64 query rows x 64 key rows per step, 4 warps per CTA (128 threads). Warp w owns the
// 16-row strip 16w..16w+15 of every 64-row tile it produces, so the softmax of the forward and
// the dS of the backward need no block barrier -- only the K/V (forward) and Q/dO (backward)
// tile loads and the transposed products of the backward do.
//
// Forward: grid (BNH, nb), nb = ceil(T/64), query block qb = nb-1-blockIdx.y (the longest rows
// start first). Q_qb is loaded once (its fragments stay in registers); for each key block
// kb = 0..qb: K_kb, V_kb -> smem; S = Q K^T (fp32 smem); per row, in the log2 domain:
// m' = max(m, max_j s_j), p_j = 2^(s_j - m'), l = l 2^(m - m') + sum p_j, O *= 2^(m - m');
// P (dt) -> smem; O += P V (the fp32 O strip is loaded into an accumulator, updated, stored).
// Masking (j > i, j >= T) only in the diagonal block kb == qb. Every row has j = 0 in block 0,
// so m is finite after the first block. o = O / l, lse = ln2 (m + log2 l).
//
// Backward: (1) D_i = sum_d do_i,d o_i,d (fp32, scratch[0 .. BNH*T)), the dq accumulator
// (scratch[BNH*T ..), fp32 [BNH, T, hs]) zeroed; (2) grid (BNH, nb), key block kb = blockIdx.y:
// K_kb, V_kb -> smem once; for query blocks qb = kb..nb-1: Q, dO, lse, D -> smem; S = Q K^T and
// dP = dO V^T (fp32, warp strips by query row); P = exp(scale S - lse) masked (i < T, j <= i),
// dS = P (dP - D) -> smem as dt; barrier; dV += P^T dO and dK += dS^T Q in register
// accumulators (warp strips by key row); dQ_strip = dS K -> smem -> atomicAdd(scale *) into the
// fp32 accumulator; finally dK *= scale, dK and dV rounded to dt. (3) dq = dt(accumulator).
//
// The softmax runs two lanes per row (32 columns each, one shuffle per reduction). The next
// K/V tile (forward) and Q/dO tile (backward, hs <= 64) are fetched into registers while the
// current one is computed, and stored to shared memory after the next barrier.
//
// Shared memory (bytes), rows padded by 8 elements (16-byte dt rows, staggered banks, 8-bank
// shifted fp32 rows for conflict-free accumulator stores; every fragment pointer stays 32-byte
// aligned as WMMA requires):
//   forward  Q,K,V [64][hs+8] dt, P [64][72] dt, S [64][72] f32, O [64][hs+8] f32, 1/l [64]
//            hs 64: 73,984 (3 CTAs/SM on sm_90)   hs 128: 114,944   hs 32: 53,504
//   backward K,V,Q,dO [64][hs+8] dt, P,dS [64][72] dt, S/dQ [64][max(64,hs)+8] f32,
//            dP [64][72] f32, lse, D [64] f32
//            hs 64: 92,672 (2 CTAs/SM)   hs 128: 141,824   hs 32: 76,288
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <climits>
#include <cstddef>
#include <cstdint>

#include "ds/core/cuda_check.h"
#include "ds/core/cuda_convert.cuh"
#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/nn/cuda_flash.h"

namespace ds::nn::cuda {
namespace flash_detail {

namespace wmma = nvcuda::wmma;
using ds::cuda::from_f;
using ds::cuda::to_f;

constexpr int kB = 64;          // query rows = key rows per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStrip = 16;      // rows per warp strip (kB / kWarps)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kStrip * kWarps == kB, "one 16-row strip per warp");

constexpr int align128(int b) { return (b + 127) / 128 * 128; }

template <int HS>
struct FwdLayout {
  static constexpr int ldh = HS + 8;  // Q, K, V (dt)
  static constexpr int ldp = kB + 8;  // P (dt)
  static constexpr int lds = kB + 8;  // S (f32; +8: conflict-free accumulator stores)
  static constexpr int ldo = HS + 8;  // O (f32)
  static constexpr int q = 0;
  static constexpr int k = align128(q + kB * ldh * 2);
  static constexpr int v = align128(k + kB * ldh * 2);
  static constexpr int p = align128(v + kB * ldh * 2);
  static constexpr int s = align128(p + kB * ldp * 2);
  static constexpr int o = align128(s + kB * lds * 4);
  static constexpr int inv_l = align128(o + kB * ldo * 4);
  static constexpr int total = align128(inv_l + kB * 4);
};

template <int HS>
struct BwdLayout {
  static constexpr int ldh = HS + 8;                        // K, V, Q, dO (dt)
  static constexpr int ldp = kB + 8;                        // P, dS (dt)
  static constexpr int lds = (HS > kB ? HS : kB) + 8;       // S, then the dQ strip (f32)
  static constexpr int ldd = kB + 8;                        // dP (f32)
  static constexpr int k = 0;
  static constexpr int v = align128(k + kB * ldh * 2);
  static constexpr int q = align128(v + kB * ldh * 2);
  static constexpr int dout = align128(q + kB * ldh * 2);
  static constexpr int p = align128(dout + kB * ldh * 2);
  static constexpr int ds = align128(p + kB * ldp * 2);
  static constexpr int s = align128(ds + kB * ldp * 2);
  static constexpr int dp = align128(s + kB * lds * 4);
  static constexpr int lse = align128(dp + kB * ldd * 4);
  static constexpr int d = align128(lse + kB * 4);
  static constexpr int total = align128(d + kB * 4);
};

// WMMA needs 256-bit aligned fragment pointers: strips of 16 rows and 16-column steps.
template <int ld, int esize>
constexpr bool frag_aligned() { return (16 * ld * esize) % 32 == 0 && (16 * esize) % 32 == 0 && (ld * esize) % 16 == 0; }
static_assert(frag_aligned<FwdLayout<32>::ldh, 2>() && frag_aligned<FwdLayout<64>::ldh, 2>() &&
              frag_aligned<FwdLayout<128>::ldh, 2>() && frag_aligned<FwdLayout<64>::ldp, 2>() &&
              frag_aligned<FwdLayout<64>::lds, 4>() && frag_aligned<FwdLayout<32>::ldo, 4>() &&
              frag_aligned<FwdLayout<64>::ldo, 4>() && frag_aligned<FwdLayout<128>::ldo, 4>() &&
              frag_aligned<BwdLayout<32>::lds, 4>() && frag_aligned<BwdLayout<128>::lds, 4>() &&
              frag_aligned<BwdLayout<64>::ldd, 4>(), "WMMA fragment alignment");

template <typename T>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Rows row0 .. row0+63 of a [Tn, HS] head (16-byte chunks), rows >= Tn zero-filled.
template <typename T, int HS>
__device__ __forceinline__ void load_tile(T* dst, int ld, const T* __restrict__ src, int row0, int Tn) {
  constexpr int kChunks = HS / 8;
  for (int c = threadIdx.x; c < kB * kChunks; c += kThreads) {
    const int r = c / kChunks, cc = c % kChunks;
    uint4 val = make_uint4(0u, 0u, 0u, 0u);
    if (row0 + r < Tn) val = *reinterpret_cast<const uint4*>(src + std::int64_t(row0 + r) * HS + cc * 8);
    *reinterpret_cast<uint4*>(dst + r * ld + cc * 8) = val;
  }
}

// The same tile staged through registers: fetch() issues the global loads (the next tile,
// in flight while the current one is computed), store() writes them to shared memory.
template <typename T, int HS>
struct TileRegs {
  static constexpr int kChunks = HS / 8;
  static constexpr int kPer = kB * kChunks / kThreads;
  static_assert(kPer * kThreads == kB * kChunks, "whole chunks per thread");
  uint4 r[kPer];
  __device__ __forceinline__ void fetch(const T* __restrict__ src, int row0, int Tn) {
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int c = int(threadIdx.x) + t * kThreads;
      const int row = c / kChunks, cc = c % kChunks;
      r[t] = make_uint4(0u, 0u, 0u, 0u);
      if (row0 + row < Tn) r[t] = *reinterpret_cast<const uint4*>(src + std::int64_t(row0 + row) * HS + cc * 8);
    }
  }
  __device__ __forceinline__ void store(T* dst, int ld) const {
#pragma unroll
    for (int t = 0; t < kPer; ++t) {
      const int c = int(threadIdx.x) + t * kThreads;
      const int row = c / kChunks, cc = c % kChunks;
      *reinterpret_cast<uint4*>(dst + row * ld + cc * 8) = r[t];
    }
  }
};

// ------------------------------------------------------------------------------- forward
// Long on purpose: FlashAttention-2's loop as one fused kernel; its register tiles and
// shared-memory buffers live across the barriers of every step, which reads best in one place.
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) flash_fwd_kernel(T* __restrict__ o, float* __restrict__ lse,
                                                             const T* __restrict__ q, const T* __restrict__ k,
                                                             const T* __restrict__ v, int Tn, float scale_log2) {
  using L = FwdLayout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem + L::q);
  T* Ks = reinterpret_cast<T*>(smem + L::k);
  T* Vs = reinterpret_cast<T*>(smem + L::v);
  T* Ps = reinterpret_cast<T*>(smem + L::p);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  float* Os = reinterpret_cast<float*>(smem + L::o);
  float* inv_l = reinterpret_cast<float*>(smem + L::inv_l);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int qb = int(gridDim.y) - 1 - int(blockIdx.y);
  const int q0 = qb * kB;
  const std::int64_t bnh = blockIdx.x;
  const std::int64_t head = bnh * Tn * HS;
  const int wr = warp * kStrip;  // first row of this warp's strip

  load_tile<T, HS>(Qs, L::ldh, q + head, q0, Tn);
  for (int idx = lane; idx < kStrip * HS; idx += 32) Os[(wr + idx / HS) * L::ldo + idx % HS] = 0.f;
  __syncthreads();

  FragA<T> qf[HS / 16];
#pragma unroll
  for (int d = 0; d < HS / 16; ++d) wmma::load_matrix_sync(qf[d], Qs + wr * L::ldh + d * 16, L::ldh);

  // Softmax lanes: lane = 2 r + h handles row wr + r, columns h*32 .. h*32+31 of S (and
  // h*HS/2 .. of O), visited from a lane-dependent start so that the 32 lanes hit 32 banks
  // (row strides of 72 floats: bank 8 (r % 4) + (r / 4) + 4 h at the first column).
  const int sr = lane >> 1, sh = lane & 1;
  const int srow = wr + sr;
  const int si = q0 + srow;
  const int sw = (sr >> 2) + 4 * sh;
  float m_run = -INFINITY, l_run = 0.f;  // this lane's row (both lanes of the pair agree)

  TileRegs<T, HS> kreg, vreg;
  kreg.fetch(k + head, 0, Tn);
  vreg.fetch(v + head, 0, Tn);
  for (int kb = 0; kb <= qb; ++kb) {
    __syncthreads();  // every warp is done with the previous K, V
    kreg.store(Ks, L::ldh);
    vreg.store(Vs, L::ldh);
    __syncthreads();
    if (kb < qb) {  // the next K, V in flight while this block is computed
      kreg.fetch(k + head, (kb + 1) * kB, Tn);
      vreg.fetch(v + head, (kb + 1) * kB, Tn);
    }

    // S strip = Q_strip K^T  [16 x 64]
#pragma unroll
    for (int n = 0; n < kB / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
      for (int d = 0; d < HS / 16; ++d) {
        FragBT<T> kf;  // K^T: K row-major read column-major
        wmma::load_matrix_sync(kf, Ks + n * 16 * L::ldh + d * 16, L::ldh);
        wmma::mma_sync(acc, qf[d], kf, acc);
      }
      wmma::store_matrix_sync(Ss + wr * L::lds + n * 16, acc, L::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of this lane's half row.
    {
      const bool diag = kb == qb;
      const float* srp = Ss + srow * L::lds + sh * 32;
      float sv[32];
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const int col = (c + sw) & 31;
        float sc = srp[col] * scale_log2;
        if (diag) {
          const int j = kb * kB + sh * 32 + col;
          if (j > si || j >= Tn) sc = -INFINITY;
        }
        sv[c] = sc;
        mx = fmaxf(mx, sc);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_new = fmaxf(m_run, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // (cannot happen: see header)
      const float alpha = exp2f(m_run - m_use);              // 0 on the first block (m = -inf)
      T* prp = Ps + srow * L::ldp + sh * 32;
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < 32; ++c) {
        const int col = (c + sw) & 31;
        const float p = exp2f(sv[c] - m_use);
        sum += p;
        prp[col] = from_f<T>(p);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      l_run = l_run * alpha + sum;
      m_run = m_new;
      float* orp = Os + srow * L::ldo + sh * (HS / 2);
#pragma unroll
      for (int c = 0; c < HS / 2; ++c) orp[(c + sw) % (HS / 2)] *= alpha;
    }
    __syncwarp();

    // O strip += P_strip V  [16 x HS]
    FragA<T> pf[kB / 16];
#pragma unroll
    for (int kk = 0; kk < kB / 16; ++kk) wmma::load_matrix_sync(pf[kk], Ps + wr * L::ldp + kk * 16, L::ldp);
#pragma unroll
    for (int n = 0; n < HS / 16; ++n) {
      FragC acc;
      wmma::load_matrix_sync(acc, Os + wr * L::ldo + n * 16, L::ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kB / 16; ++kk) {
        FragB<T> vf;
        wmma::load_matrix_sync(vf, Vs + kk * 16 * L::ldh + n * 16, L::ldh);
        wmma::mma_sync(acc, pf[kk], vf, acc);
      }
      wmma::store_matrix_sync(Os + wr * L::ldo + n * 16, acc, L::ldo, wmma::mem_row_major);
    }
  }
  __syncwarp();

  if (sh == 0) {
    inv_l[srow] = 1.f / l_run;
    if (si < Tn) lse[bnh * Tn + si] = kLn2 * (m_run + log2f(l_run));
  }
  __syncwarp();
  for (int idx = lane; idx < kStrip * HS; idx += 32) {
    const int row = wr + idx / HS, c = idx % HS;
    const int i = q0 + row;
    if (i < Tn) o[head + std::int64_t(i) * HS + c] = from_f<T>(Os[row * L::ldo + c] * inv_l[row]);
  }
}

// ------------------------------------------------------------------------------ backward
// D[r] = sum_d dout[r, d] o[r, d]; G = HS/8 lanes per row (one 16-byte chunk each).
template <typename T, int HS>
__global__ void flash_bwd_dot_kernel(float* __restrict__ D, const T* __restrict__ o, const T* __restrict__ dout,
                                     std::int64_t rows) {
  constexpr int G = HS / 8;
  static_assert(32 % G == 0, "row groups inside a warp");
  const std::int64_t n = rows * G;
  const std::int64_t n_pad = (n + 31) / 32 * 32;  // whole warps iterate together (shuffles)
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t c = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < n_pad; c += stride) {
    float acc = 0.f;
    if (c < n) {
      const uint4 a = *reinterpret_cast<const uint4*>(o + c * 8);
      const uint4 b = *reinterpret_cast<const uint4*>(dout + c * 8);
      const T* ha = reinterpret_cast<const T*>(&a);
      const T* hb = reinterpret_cast<const T*>(&b);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += to_f(ha[e]) * to_f(hb[e]);
    }
#pragma unroll
    for (int off = G / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
    if (c < n && c % G == 0) D[c / G] = acc;
  }
}

template <typename T>
__global__ void flash_dq_convert_kernel(T* __restrict__ dq, const float* __restrict__ acc, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dq[i] = from_f<T>(acc[i]);
}

// Long on purpose: the backward pass as one fused kernel (as the forward one): dK and dV stay
// in registers over the whole loop across the query tiles.
template <typename T, int HS>
__global__ void __launch_bounds__(kThreads) flash_bwd_kernel(T* __restrict__ dk, T* __restrict__ dv,
                                                             float* __restrict__ dq_acc, const T* __restrict__ q,
                                                             const T* __restrict__ k, const T* __restrict__ v,
                                                             const T* __restrict__ dout,
                                                             const float* __restrict__ lse,
                                                             const float* __restrict__ D, int Tn, float scale) {
  using L = BwdLayout<HS>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem + L::k);
  T* Vs = reinterpret_cast<T*>(smem + L::v);
  T* Qs = reinterpret_cast<T*>(smem + L::q);
  T* dOs = reinterpret_cast<T*>(smem + L::dout);
  T* Ps = reinterpret_cast<T*>(smem + L::p);
  T* dSs = reinterpret_cast<T*>(smem + L::ds);
  float* Ss = reinterpret_cast<float*>(smem + L::s);
  float* dPs = reinterpret_cast<float*>(smem + L::dp);
  float* lse_s = reinterpret_cast<float*>(smem + L::lse);
  float* D_s = reinterpret_cast<float*>(smem + L::d);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nb = int(gridDim.y);
  const int kb = int(blockIdx.y);
  const int k0 = kb * kB;
  const std::int64_t bnh = blockIdx.x;
  const std::int64_t head = bnh * Tn * HS;
  const int wr = warp * kStrip;
  const float scale_log2 = scale * kLog2e;

  load_tile<T, HS>(Ks, L::ldh, k + head, k0, Tn);  // visible after the loop's first barrier
  load_tile<T, HS>(Vs, L::ldh, v + head, k0, Tn);

  FragC dv_acc[HS / 16], dk_acc[HS / 16];  // key rows wr .. wr+15 of dV, dK
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) {
    wmma::fill_fragment(dv_acc[n], 0.f);
    wmma::fill_fragment(dk_acc[n], 0.f);
  }

  // Q, dO, lse, D of the next query block are fetched into registers while the current one is
  // computed (hs <= 64; hs 128 is register-bound already and loads just before the store).
  constexpr bool kPrefetch = HS <= 64;
  TileRegs<T, HS> qreg, doreg;
  float lse_r = 0.f, D_r = 0.f;  // threads 0..63: row threadIdx.x of the block
  auto fetch = [&](int qb) {
    qreg.fetch(q + head, qb * kB, Tn);
    doreg.fetch(dout + head, qb * kB, Tn);
    const int i = qb * kB + int(threadIdx.x);
    lse_r = threadIdx.x < kB && i < Tn ? lse[bnh * Tn + i] * kLog2e : 0.f;
    D_r = threadIdx.x < kB && i < Tn ? D[bnh * Tn + i] : 0.f;
  };
  if constexpr (kPrefetch) fetch(kb);

  for (int qb = kb; qb < nb; ++qb) {
    const int q0 = qb * kB;
    __syncthreads();  // every warp is done with the previous Q, dO, P, dS
    if constexpr (!kPrefetch) fetch(qb);
    qreg.store(Qs, L::ldh);
    doreg.store(dOs, L::ldh);
    if (threadIdx.x < kB) {
      lse_s[threadIdx.x] = lse_r;
      D_s[threadIdx.x] = D_r;
    }
    __syncthreads();
    if constexpr (kPrefetch) {
      if (qb + 1 < nb) fetch(qb + 1);
    }

    // S strip = Q_strip K^T, dP strip = dO_strip V^T  [16 x 64] each (query rows wr..)
#pragma unroll
    for (int n = 0; n < kB / 16; ++n) {
      FragC s_acc, p_acc;
      wmma::fill_fragment(s_acc, 0.f);
      wmma::fill_fragment(p_acc, 0.f);
#pragma unroll
      for (int d = 0; d < HS / 16; ++d) {
        FragA<T> af;
        FragBT<T> bf;
        wmma::load_matrix_sync(af, Qs + wr * L::ldh + d * 16, L::ldh);
        wmma::load_matrix_sync(bf, Ks + n * 16 * L::ldh + d * 16, L::ldh);
        wmma::mma_sync(s_acc, af, bf, s_acc);
        wmma::load_matrix_sync(af, dOs + wr * L::ldh + d * 16, L::ldh);
        wmma::load_matrix_sync(bf, Vs + n * 16 * L::ldh + d * 16, L::ldh);
        wmma::mma_sync(p_acc, af, bf, p_acc);
      }
      wmma::store_matrix_sync(Ss + wr * L::lds + n * 16, s_acc, L::lds, wmma::mem_row_major);
      wmma::store_matrix_sync(dPs + wr * L::ldd + n * 16, p_acc, L::ldd, wmma::mem_row_major);
    }
    __syncwarp();

    // P = exp(scale S - lse) where i < T and j <= i (else 0); dS = P (dP - D).
#pragma unroll 4
    for (int r = 0; r < kStrip; ++r) {
      const int row = wr + r;
      const int i = q0 + row;
      const float lse_i = lse_s[row], D_i = D_s[row];
#pragma unroll
      for (int c = lane; c < kB; c += 32) {
        const int j = k0 + c;
        float p = 0.f;
        if (i < Tn && j <= i) p = exp2f(fmaf(Ss[row * L::lds + c], scale_log2, -lse_i));
        const float dsv = p * (dPs[row * L::ldd + c] - D_i);
        Ps[row * L::ldp + c] = from_f<T>(p);
        dSs[row * L::ldp + c] = from_f<T>(dsv);
      }
    }
    __syncthreads();  // P and dS of every query row, for the key-row strips below

    // dV_strip += P^T dO, dK_strip += dS^T Q  (key rows wr..; P^T: P row-major read column-major)
#pragma unroll
    for (int kk = 0; kk < kB / 16; ++kk) {
      FragAT<T> pt, dst;
      wmma::load_matrix_sync(pt, Ps + kk * 16 * L::ldp + wr, L::ldp);
      wmma::load_matrix_sync(dst, dSs + kk * 16 * L::ldp + wr, L::ldp);
#pragma unroll
      for (int n = 0; n < HS / 16; ++n) {
        FragB<T> bf;
        wmma::load_matrix_sync(bf, dOs + kk * 16 * L::ldh + n * 16, L::ldh);
        wmma::mma_sync(dv_acc[n], pt, bf, dv_acc[n]);
        wmma::load_matrix_sync(bf, Qs + kk * 16 * L::ldh + n * 16, L::ldh);
        wmma::mma_sync(dk_acc[n], dst, bf, dk_acc[n]);
      }
    }

    // dQ strip = dS_strip K  [16 x HS] (query rows wr..) -> S's rows (this warp's) -> atomics
    {
      FragA<T> dsf[kB / 16];
#pragma unroll
      for (int kk = 0; kk < kB / 16; ++kk) wmma::load_matrix_sync(dsf[kk], dSs + wr * L::ldp + kk * 16, L::ldp);
#pragma unroll
      for (int n = 0; n < HS / 16; ++n) {
        FragC acc;
        wmma::fill_fragment(acc, 0.f);
#pragma unroll
        for (int kk = 0; kk < kB / 16; ++kk) {
          FragB<T> kf;
          wmma::load_matrix_sync(kf, Ks + kk * 16 * L::ldh + n * 16, L::ldh);
          wmma::mma_sync(acc, dsf[kk], kf, acc);
        }
        wmma::store_matrix_sync(Ss + wr * L::lds + n * 16, acc, L::lds, wmma::mem_row_major);
      }
    }
    __syncwarp();
    for (int idx = lane; idx < kStrip * HS; idx += 32) {
      const int row = wr + idx / HS, c = idx % HS;
      const int i = q0 + row;
      if (i < Tn) atomicAdd(dq_acc + (bnh * Tn + i) * HS + c, scale * Ss[row * L::lds + c]);
    }
    __syncwarp();
  }

  // dV, dK strips (key rows wr..) through this warp's rows of S, rounded to dt.
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(Ss + wr * L::lds + n * 16, dv_acc[n], L::lds, wmma::mem_row_major);
  __syncwarp();
  for (int idx = lane; idx < kStrip * HS; idx += 32) {
    const int row = wr + idx / HS, c = idx % HS;
    const int j = k0 + row;
    if (j < Tn) dv[head + std::int64_t(j) * HS + c] = from_f<T>(Ss[row * L::lds + c]);
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < HS / 16; ++n) wmma::store_matrix_sync(Ss + wr * L::lds + n * 16, dk_acc[n], L::lds, wmma::mem_row_major);
  __syncwarp();
  for (int idx = lane; idx < kStrip * HS; idx += 32) {
    const int row = wr + idx / HS, c = idx % HS;
    const int j = k0 + row;
    if (j < Tn) dk[head + std::int64_t(j) * HS + c] = from_f<T>(scale * Ss[row * L::lds + c]);
  }
}

// ---------------------------------------------------------------------------------- host
template <class F>
void dispatch(DType dt, std::int64_t hs, const char* who, F&& f) {
  DS_CHECK(flash_attention_supported(dt, hs),
           who << ": unsupported dtype " << dtype_name(dt) << " / head size " << hs
               << " (fp16 or bf16, hs 32, 64 or 128)");
  auto with_hs = [&]<typename T>() {
    switch (hs) {
      case 32: return f.template operator()<T, 32>();
      case 64: return f.template operator()<T, 64>();
      default: return f.template operator()<T, 128>();
    }
  };
  if (dt == DType::F16) with_hs.template operator()<__half>();
  else with_hs.template operator()<__nv_bfloat16>();
}

void check_sizes(const char* who, std::int64_t BNH, std::int64_t T, std::int64_t hs) {
  DS_CHECK(BNH >= 0 && T >= 0, who << ": bad sizes BNH=" << BNH << " T=" << T);
  DS_CHECK(BNH <= std::int64_t(INT_MAX), who << ": BNH=" << BNH << " exceeds the grid");
  DS_CHECK((T + kB - 1) / kB <= 65535, who << ": T=" << T << " exceeds the grid (at most 65535 blocks of 64)");
  DS_CHECK(T * hs <= std::int64_t(INT_MAX), who << ": T*hs=" << T * hs << " too large");
}

void check_aligned(const char* who, const char* what, const void* p) {
  DS_CHECK((reinterpret_cast<std::uintptr_t>(p) & 15u) == 0,
           who << ": " << what << " must be 16-byte aligned (got " << p << ")");
}

template <class K>
void set_smem(K kernel, int bytes) {
  DS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  DS_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                     int(cudaSharedmemCarveoutMaxShared)));
}

unsigned grid_for(std::int64_t items, int threads) {
  std::int64_t b = (items + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > 65535 * 8) b = 65535 * 8;  // grid-stride loops cover the rest
  return unsigned(b);
}

}  // namespace flash_detail

bool flash_attention_supported(DType dt, std::int64_t hs) {
  return (dt == DType::F16 || dt == DType::BF16) && (hs == 32 || hs == 64 || hs == 128);
}

std::size_t flash_backward_scratch_floats(std::int64_t BNH, std::int64_t T, std::int64_t hs) {
  DS_CHECK(BNH >= 0 && T >= 0 && hs >= 0, "flash_backward_scratch_floats: bad sizes");
  return std::size_t(BNH) * std::size_t(T) * std::size_t(hs + 1);  // D, then the dq accumulator
}

void flash_attention_forward(void* o, float* lse, const void* q, const void* k, const void* v,
                             std::int64_t BNH, std::int64_t T, std::int64_t hs, float scale,
                             DType dt, cudaStream_t stream) {
  using namespace flash_detail;
  const char* who = "flash_attention_forward";
  check_sizes(who, BNH, T, hs);
  if (BNH == 0 || T == 0) return;
  check_aligned(who, "q", q);
  check_aligned(who, "k", k);
  check_aligned(who, "v", v);
  dispatch(dt, hs, who, [&]<typename Tp, int HS>() {
    auto kernel = flash_fwd_kernel<Tp, HS>;
    const int smem = FwdLayout<HS>::total;
    set_smem(kernel, smem);
    const dim3 grid(unsigned(BNH), unsigned((T + kB - 1) / kB));
    kernel<<<grid, kThreads, smem, stream>>>(static_cast<Tp*>(o), lse, static_cast<const Tp*>(q),
                                             static_cast<const Tp*>(k), static_cast<const Tp*>(v), int(T),
                                             scale * kLog2e);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void flash_attention_backward(void* dq, void* dk, void* dv, const void* q, const void* k,
                              const void* v, const void* o, const void* dout, const float* lse,
                              float* scratch, std::int64_t BNH, std::int64_t T, std::int64_t hs,
                              float scale, DType dt, cudaStream_t stream) {
  using namespace flash_detail;
  const char* who = "flash_attention_backward";
  check_sizes(who, BNH, T, hs);
  if (BNH == 0 || T == 0) return;
  check_aligned(who, "q", q);
  check_aligned(who, "k", k);
  check_aligned(who, "v", v);
  check_aligned(who, "o", o);
  check_aligned(who, "dout", dout);
  DS_CHECK(scratch != nullptr, who << ": scratch is null");
  const std::int64_t rows = BNH * T;
  float* D = scratch;
  float* dq_acc = scratch + rows;
  dispatch(dt, hs, who, [&]<typename Tp, int HS>() {
    constexpr int kDotThreads = 256;
    flash_bwd_dot_kernel<Tp, HS><<<grid_for(rows * (HS / 8), kDotThreads), kDotThreads, 0, stream>>>(
        D, static_cast<const Tp*>(o), static_cast<const Tp*>(dout), rows);
    DS_CUDA_CHECK_LAUNCH();
    DS_CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, std::size_t(rows) * HS * sizeof(float), stream));

    auto kernel = flash_bwd_kernel<Tp, HS>;
    const int smem = BwdLayout<HS>::total;
    set_smem(kernel, smem);
    const dim3 grid(unsigned(BNH), unsigned((T + kB - 1) / kB));
    kernel<<<grid, kThreads, smem, stream>>>(static_cast<Tp*>(dk), static_cast<Tp*>(dv), dq_acc,
                                             static_cast<const Tp*>(q), static_cast<const Tp*>(k),
                                             static_cast<const Tp*>(v), static_cast<const Tp*>(dout), lse, D,
                                             int(T), scale);
    DS_CUDA_CHECK_LAUNCH();

    constexpr int kCvtThreads = 256;
    flash_dq_convert_kernel<Tp><<<grid_for(rows * HS, kCvtThreads), kCvtThreads, 0, stream>>>(
        static_cast<Tp*>(dq), dq_acc, rows * HS);
    DS_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ds::nn::cuda
