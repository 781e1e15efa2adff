// CUDA kernels of the Llama-style decoder (ds/nn/cuda_llama_kernels.h): RMSNorm, rotary
// embedding, SwiGLU and the kv-head expansion for grouped-query attention. Plain kernels
// first (one warp per row for RMSNorm, grid-stride loops elsewhere); the GPT's vectorised
// tricks can come once they have been measured on a GPU.
#include "ds/nn/cuda_llama_kernels.h"

#include "layer_common.cuh"

namespace ds::nn::cuda {
namespace detail {
namespace {

constexpr int kRowsPerBlock = kThreads / kWarp;  // one warp per row

inline unsigned row_blocks(std::int64_t rows) {
  const std::int64_t b = ceil_div(rows, kRowsPerBlock);
  const std::int64_t cap = 65535 * 4;
  return unsigned(b < 1 ? 1 : b > cap ? cap : b);
}

template <typename T>
__global__ void rmsnorm_forward_kernel(T* out, float* rstd, const T* inp, const T* w, std::int64_t N, std::int64_t C,
                                       float eps) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t wstride = std::int64_t(gridDim.x) * kRowsPerBlock;
  // row is the same for the 32 lanes of a warp: the loop and the shuffles are warp-uniform.
  for (std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; row < N; row += wstride) {
    const T* x = inp + row * C;
    float ss = 0.f;
    for (std::int64_t c = lane; c < C; c += kWarp) {
      const float v = ld(x, c);
      ss += v * v;
    }
    const float r = 1.f / sqrtf(warp_sum(ss) / float(C) + eps);
    T* y = out + row * C;
    for (std::int64_t c = lane; c < C; c += kWarp) st(y, c, ld(w, c) * (ld(x, c) * r));
    if (lane == 0 && rstd != nullptr) rstd[row] = r;
  }
}

template <typename T>
__global__ void rmsnorm_dinp_kernel(T* dinp, const T* dout, const T* inp, const T* w, const float* rstd,
                                    std::int64_t N, std::int64_t C) {
  const int lane = threadIdx.x % kWarp;
  const std::int64_t wstride = std::int64_t(gridDim.x) * kRowsPerBlock;
  for (std::int64_t row = std::int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; row < N; row += wstride) {
    const T* x = inp + row * C;
    const T* dy = dout + row * C;
    const float r = rstd[row];
    float dot = 0.f;
    for (std::int64_t c = lane; c < C; c += kWarp) dot += ld(w, c) * ld(dy, c) * ld(x, c);
    const float k = warp_sum(dot) * r * r / float(C);
    T* dx = dinp + row * C;
    for (std::int64_t c = lane; c < C; c += kWarp)
      st(dx, c, ld(dx, c) + r * (ld(w, c) * ld(dy, c) - ld(x, c) * k));
  }
}

// Block (kColX, kColY), grid (ceil(C / kColX), chunks): pw[chunk, c] = sum of dy x rstd over
// the chunk's rows (fixed order).
template <typename T>
__global__ void rmsnorm_partial_kernel(float* pw, const T* dout, const T* inp, const float* rstd, std::int64_t N,
                                       std::int64_t C, std::int64_t rows_per_chunk) {
  __shared__ float sh[kColY][kColX];
  const std::int64_t c = std::int64_t(blockIdx.x) * kColX + threadIdx.x;
  const std::int64_t r0 = std::int64_t(blockIdx.y) * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float a = 0.f;
  if (c < C)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColY) a += ld(dout, r * C + c) * ld(inp, r * C + c) * rstd[r];
  sh[threadIdx.y][threadIdx.x] = a;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float s = 0.f;
#pragma unroll
    for (int y = 0; y < kColY; ++y) s += sh[y][threadIdx.x];
    pw[std::int64_t(blockIdx.y) * C + c] = s;
  }
}

// One thread per (row, head, i < hd/2) pair; sign -1 rotates back (backward).
template <typename T>
__global__ void rope_kernel(T* x, std::int64_t N, std::int64_t T_, std::int64_t ld_, std::int64_t n_heads,
                            std::int64_t hd, const float* cos, const float* sin, float sign) {
  const std::int64_t h2 = hd / 2, items = N * n_heads * h2;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t it = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; it < items; it += stride) {
    const std::int64_t i = it % h2, rh = it / h2, h = rh % n_heads, r = rh / n_heads;
    const std::int64_t t = r % T_;
    T* a = x + r * ld_ + h * hd;
    const float c = cos[t * h2 + i], s = sign * sin[t * h2 + i];
    const float x1 = ld(a, i), x2 = ld(a, i + h2);
    st(a, i, x1 * c - x2 * s);
    st(a, i + h2, x2 * c + x1 * s);
  }
}

template <typename T>
__global__ void swiglu_forward_kernel(T* out, const T* gate, const T* up, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = ld(gate, i);
    st(out, i, g / (1.f + expf(-g)) * ld(up, i));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up, std::int64_t n) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float g = ld(gate, i), u = ld(up, i), dy = ld(dout, i);
    const float sig = 1.f / (1.f + expf(-g));
    st(dup, i, dy * g * sig);
    st(dgate, i, dy * u * sig * (1.f + g * (1.f - sig)));
  }
}

// yh[b,h,t,d] = x[b,t,(h / group) * hd + d]
template <typename T>
__global__ void expand_kv_kernel(T* yh, const T* x, std::int64_t B, std::int64_t T_, std::int64_t NH,
                                 std::int64_t NKV, std::int64_t hd) {
  const std::int64_t items = B * NH * T_ * hd, group = NH / NKV;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < items; i += stride) {
    const std::int64_t d = i % hd, t = (i / hd) % T_, h = (i / (hd * T_)) % NH, b = i / (hd * T_ * NH);
    yh[i] = x[(b * T_ + t) * NKV * hd + (h / group) * hd + d];
  }
}

// dx[b,t,kvh*hd+d] = sum_j dyh[b, kvh*group + j, t, d]
template <typename T>
__global__ void reduce_kv_kernel(T* dx, const T* dyh, std::int64_t B, std::int64_t T_, std::int64_t NH,
                                 std::int64_t NKV, std::int64_t hd) {
  const std::int64_t items = B * T_ * NKV * hd, group = NH / NKV;
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < items; i += stride) {
    const std::int64_t d = i % hd, kvh = (i / hd) % NKV, t = (i / (hd * NKV)) % T_, b = i / (hd * NKV * T_);
    float s = 0.f;
    for (std::int64_t j = 0; j < group; ++j) s += ld(dyh, ((b * NH + kvh * group + j) * T_ + t) * hd + d);
    st(dx, i, s);
  }
}

}  // namespace
}  // namespace detail

using namespace detail;

void rmsnorm_forward(void* out, float* rstd, const void* inp, const void* w, std::int64_t N, std::int64_t C,
                     float eps, DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && C > 0, "rmsnorm_forward: bad sizes N=" << N << " C=" << C);
  if (N == 0) return;
  dispatch(dt, "rmsnorm_forward", [&]<typename T>() {
    rmsnorm_forward_kernel<T><<<row_blocks(N), kThreads, 0, stream>>>(
        static_cast<T*>(out), rstd, static_cast<const T*>(inp), static_cast<const T*>(w), N, C, eps);
  });
  DS_CUDA_CHECK_LAUNCH();
}

std::size_t rmsnorm_scratch_floats(std::int64_t N, std::int64_t C) {
  return C <= 0 ? 0 : std::size_t(col_chunks(N) * C);
}

void rmsnorm_backward(void* dinp, void* dw, const void* dout, const void* inp, const void* w, const float* rstd,
                      std::int64_t N, std::int64_t C, float* scratch, DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && C > 0, "rmsnorm_backward: bad sizes N=" << N << " C=" << C);
  if (N == 0) return;
  DS_CHECK(scratch != nullptr || dw == nullptr, "rmsnorm_backward: null scratch");
  dispatch(dt, "rmsnorm_backward", [&]<typename T>() {
    const T* dy = static_cast<const T*>(dout);
    const T* x = static_cast<const T*>(inp);
    if (dinp != nullptr) {
      rmsnorm_dinp_kernel<T><<<row_blocks(N), kThreads, 0, stream>>>(static_cast<T*>(dinp), dy, x,
                                                                      static_cast<const T*>(w), rstd, N, C);
      DS_CUDA_CHECK_LAUNCH();
    }
    if (dw != nullptr) {
      const std::int64_t chunks = col_chunks(N), rows_per_chunk = ceil_div(N, chunks);
      const dim3 grid(unsigned(ceil_div(C, kColX)), unsigned(chunks));
      rmsnorm_partial_kernel<T><<<grid, dim3(kColX, kColY), 0, stream>>>(scratch, dy, x, rstd, N, C, rows_per_chunk);
      DS_CUDA_CHECK_LAUNCH();
      reduce_chunks_add_kernel<T><<<unsigned(ceil_div(C, kWarp)), kReduceThreads, 0, stream>>>(
          static_cast<T*>(dw), scratch, chunks, C);
      DS_CUDA_CHECK_LAUNCH();
    }
  });
}

namespace {
void rope(void* x, std::int64_t N, std::int64_t T, std::int64_t ld_, std::int64_t n_heads, std::int64_t hd,
          const float* cos, const float* sin, float sign, DType dt, cudaStream_t stream, const char* who) {
  DS_CHECK(N >= 0 && T > 0 && n_heads > 0 && hd > 0 && hd % 2 == 0 && ld_ >= n_heads * hd,
           who << ": bad sizes N=" << N << " T=" << T << " ld=" << ld_ << " n_heads=" << n_heads << " hd=" << hd);
  const std::int64_t items = N * n_heads * (hd / 2);
  if (items == 0) return;
  dispatch(dt, who, [&]<typename Tp>() {
    rope_kernel<Tp><<<blocks_for(items), kThreads, 0, stream>>>(static_cast<Tp*>(x), N, T, ld_, n_heads, hd, cos,
                                                                sin, sign);
  });
  DS_CUDA_CHECK_LAUNCH();
}
}  // namespace

void rope_forward(void* x, std::int64_t N, std::int64_t T, std::int64_t ld_, std::int64_t n_heads, std::int64_t hd,
                  const float* cos, const float* sin, DType dt, cudaStream_t stream) {
  rope(x, N, T, ld_, n_heads, hd, cos, sin, 1.f, dt, stream, "rope_forward");
}

void rope_backward(void* dx, std::int64_t N, std::int64_t T, std::int64_t ld_, std::int64_t n_heads,
                   std::int64_t hd, const float* cos, const float* sin, DType dt, cudaStream_t stream) {
  rope(dx, N, T, ld_, n_heads, hd, cos, sin, -1.f, dt, stream, "rope_backward");
}

void swiglu_forward(void* out, const void* gate, const void* up, std::int64_t n, DType dt, cudaStream_t stream) {
  DS_CHECK(n >= 0, "swiglu_forward: bad size n=" << n);
  if (n == 0) return;
  dispatch(dt, "swiglu_forward", [&]<typename T>() {
    swiglu_forward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(gate), static_cast<const T*>(up), n);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void swiglu_backward(void* dgate, void* dup, const void* dout, const void* gate, const void* up, std::int64_t n,
                     DType dt, cudaStream_t stream) {
  DS_CHECK(n >= 0, "swiglu_backward: bad size n=" << n);
  if (n == 0) return;
  dispatch(dt, "swiglu_backward", [&]<typename T>() {
    swiglu_backward_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dout), static_cast<const T*>(gate),
        static_cast<const T*>(up), n);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void expand_kv_heads(void* yh, const void* x, std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                     std::int64_t hd, DType dt, cudaStream_t stream) {
  DS_CHECK(B >= 0 && T >= 0 && hd > 0 && NKV > 0 && NH % NKV == 0,
           "expand_kv_heads: bad sizes B=" << B << " T=" << T << " NH=" << NH << " NKV=" << NKV << " hd=" << hd);
  const std::int64_t items = B * NH * T * hd;
  if (items == 0) return;
  dispatch(dt, "expand_kv_heads", [&]<typename Tp>() {
    expand_kv_kernel<Tp><<<blocks_for(items), kThreads, 0, stream>>>(static_cast<Tp*>(yh), static_cast<const Tp*>(x),
                                                                     B, T, NH, NKV, hd);
  });
  DS_CUDA_CHECK_LAUNCH();
}

void reduce_kv_heads(void* dx, const void* dyh, std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t NKV,
                     std::int64_t hd, DType dt, cudaStream_t stream) {
  DS_CHECK(B >= 0 && T >= 0 && hd > 0 && NKV > 0 && NH % NKV == 0,
           "reduce_kv_heads: bad sizes B=" << B << " T=" << T << " NH=" << NH << " NKV=" << NKV << " hd=" << hd);
  const std::int64_t items = B * T * NKV * hd;
  if (items == 0) return;
  dispatch(dt, "reduce_kv_heads", [&]<typename Tp>() {
    reduce_kv_kernel<Tp><<<blocks_for(items), kThreads, 0, stream>>>(static_cast<Tp*>(dx),
                                                                     static_cast<const Tp*>(dyh), B, T, NH, NKV, hd);
  });
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::nn::cuda
