// CUDA LayerNorm (forward / backward) and token + position embedding (forward / backward).
// LayerNorm: one warp per row (fp32 two-pass mean / variance); the backward's dw / db are
// column sums, computed per chunk of rows into the scratch and reduced over the chunks in a
// fixed order (deterministic, no float atomics). Embedding backward: dwpe by a fixed-order
// loop over the batch; dwte through fp32 atomics into the caller's scratch, then one rounded
// add per element.
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

std::size_t layernorm_scratch_floats(std::int64_t N, std::int64_t C) {
  return C > 0 ? std::size_t(2 * col_chunks(N) * C) : 0;
}

void layernorm_backward(void* dinp, void* dw, void* db, const void* dout, const void* inp, const void* w,
                        const float* mean, const float* rstd, std::int64_t N, std::int64_t C, float* scratch,
                        DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && C > 0, "layernorm_backward: bad sizes N=" << N << " C=" << C);
  if (N == 0) return;
  DS_CHECK(scratch != nullptr || (dw == nullptr && db == nullptr), "layernorm_backward: null scratch");
  const std::int64_t chunks = col_chunks(N);
  const std::int64_t rows_per_chunk = ceil_div(N, chunks);
  float* pw = scratch;
  float* pb = scratch + chunks * C;
  dispatch(dt, "layernorm_backward", [&]<typename T>() {
    if (dinp != nullptr) {
      layernorm_dinp_kernel<T><<<blocks_for(N, kRowsPerBlock), kThreads, 0, stream>>>(
          static_cast<T*>(dinp), static_cast<const T*>(dout), static_cast<const T*>(inp), static_cast<const T*>(w),
          mean, rstd, N, C);
      DS_CUDA_CHECK_LAUNCH();
    }
    if (dw != nullptr || db != nullptr) {
      const dim3 grid(unsigned(ceil_div(C, kColX)), unsigned(chunks));
      layernorm_partial_kernel<T><<<grid, dim3(kColX, kColY), 0, stream>>>(
          pw, pb, static_cast<const T*>(dout), static_cast<const T*>(inp), mean, rstd, N, C, rows_per_chunk);
      DS_CUDA_CHECK_LAUNCH();
      if (dw != nullptr) {
        reduce_chunks_add_kernel<T><<<blocks_for(C), kThreads, 0, stream>>>(static_cast<T*>(dw), pw, chunks, C);
        DS_CUDA_CHECK_LAUNCH();
      }
      if (db != nullptr) {
        reduce_chunks_add_kernel<T><<<blocks_for(C), kThreads, 0, stream>>>(static_cast<T*>(db), pb, chunks, C);
        DS_CUDA_CHECK_LAUNCH();
      }
    }
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
