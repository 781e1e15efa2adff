// CUDA elementwise layers: bias + residual add, bias gradient (deterministic column sums),
// GPT-2 tanh GELU forward / backward, mean of an fp32 vector, dtype conversion.
// Memory-bound grid-stride loops: 128-bit vector steps when every pointer is 16-byte aligned,
// then a guarded element-by-element tail (the whole range when a pointer is misaligned).
#include "layer_common.cuh"

namespace ds::nn::cuda {
namespace detail {

// ---------------------------------------------------------------- add_bias_residual
template <typename T>
__global__ void add_bias_residual_kernel(T* out, const T* bias, const T* residual, std::int64_t n,
                                         std::int64_t OC, std::int64_t nvec) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t t = tid; t < nvec; t += stride) {
    const std::int64_t i = t * kVec;
    float o[kVec];
    load8(out, i, o);
    if (bias != nullptr) {
      std::int64_t c = i % OC;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        o[k] += ld(bias, c);
        if (++c == OC) c = 0;
      }
    }
    if (residual != nullptr) {
      float r[kVec];
      load8(residual, i, r);
#pragma unroll
      for (int k = 0; k < kVec; ++k) o[k] += r[k];
    }
    store8(out, i, o);
  }
  for (std::int64_t i = nvec * kVec + tid; i < n; i += stride) {
    float o = ld(out, i);
    if (bias != nullptr) o += ld(bias, i % OC);
    if (residual != nullptr) o += ld(residual, i);
    st(out, i, o);
  }
}

// ---------------------------------------------------------------- bias_backward
// Block (kColX, kColY), grid (ceil(OC / kColX), chunks): part[chunk, o] = sum of dout[n, o]
// over the chunk's rows (thread y sums rows y, y + kColY, ...; then the y partials in order).
template <typename T>
__global__ void bias_partial_kernel(float* part, const T* dout, std::int64_t N, std::int64_t OC,
                                    std::int64_t rows_per_chunk) {
  __shared__ float sh[kColY][kColX];
  const std::int64_t o = std::int64_t(blockIdx.x) * kColX + threadIdx.x;
  const std::int64_t r0 = std::int64_t(blockIdx.y) * rows_per_chunk;
  const std::int64_t r1 = r0 + rows_per_chunk < N ? r0 + rows_per_chunk : N;
  float acc = 0.f;
  if (o < OC)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kColY) acc += ld(dout, r * OC + o);
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && o < OC) {
    float s = 0.f;
#pragma unroll
    for (int y = 0; y < kColY; ++y) s += sh[y][threadIdx.x];
    part[std::int64_t(blockIdx.y) * OC + o] = s;
  }
}

// ---------------------------------------------------------------- GELU
constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

struct GeluFwd {
  __device__ __forceinline__ float operator()(float x, float) const {
    return 0.5f * x * (1.f + tanhf(kGeluS * (x + kGeluA * x * x * x)));
  }
};
struct GeluBwd {  // (inp, dout) -> dout * gelu'(inp)
  __device__ __forceinline__ float operator()(float x, float d) const {
    const float t = tanhf(kGeluS * (x + kGeluA * x * x * x));
    const float g = 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * kGeluS * (1.f + 3.f * kGeluA * x * x);
    return d * g;
  }
};

// out[i] = op(a[i], b ? b[i] : 0). out may alias a or b (each element is read, then written,
// by the same thread).
template <typename T, class Op>
__global__ void map_kernel(T* out, const T* a, const T* b, std::int64_t n, std::int64_t nvec, Op op) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t t = tid; t < nvec; t += stride) {
    const std::int64_t i = t * kVec;
    float x[kVec], y[kVec] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    load8(a, i, x);
    if (b != nullptr) load8(b, i, y);
#pragma unroll
    for (int k = 0; k < kVec; ++k) x[k] = op(x[k], y[k]);
    store8(out, i, x);
  }
  for (std::int64_t i = nvec * kVec + tid; i < n; i += stride)
    st(out, i, op(ld(a, i), b != nullptr ? ld(b, i) : 0.f));
}

template <class Op>
void launch_map(const char* who, void* out, const void* a, const void* b, std::int64_t n, DType dt,
                cudaStream_t stream) {
  DS_CHECK(n >= 0, who << ": negative size " << n);
  if (n == 0) return;
  const bool vec = aligned16(out) && aligned16(a) && aligned16(b);
  const std::int64_t nvec = vec ? n / kVec : 0;
  const unsigned blocks = blocks_for(nvec + (n - nvec * kVec));
  dispatch(dt, who, [&]<typename T>() {
    map_kernel<T, Op><<<blocks, kThreads, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(a),
                                                       static_cast<const T*>(b), n, nvec, Op{});
  });
  DS_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------- mean
constexpr int kMeanThreads = 1024;  // power of two (tree reduction)

__global__ void mean_kernel(float* out, const float* x, std::int64_t n) {
  __shared__ float sh[kMeanThreads];
  float acc = 0.f;
  for (std::int64_t i = threadIdx.x; i < n; i += kMeanThreads) acc += x[i];
  sh[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kMeanThreads / 2; s > 0; s >>= 1) {
    if (int(threadIdx.x) < s) sh[threadIdx.x] += sh[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = sh[0] / float(n);
}

// ---------------------------------------------------------------- convert
template <typename D, typename S>
__global__ void convert_kernel(D* dst, const S* src, std::int64_t n, std::int64_t nvec) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  const std::int64_t tid = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::int64_t t = tid; t < nvec; t += stride) {
    float r[kVec];
    load8(src, t * kVec, r);
    store8(dst, t * kVec, r);
  }
  for (std::int64_t i = nvec * kVec + tid; i < n; i += stride) st(dst, i, ld(src, i));
}

}  // namespace detail

using namespace detail;

void add_bias_residual(void* out, const void* bias, const void* residual, std::int64_t N, std::int64_t OC,
                       DType dt, cudaStream_t stream) {
  DS_CHECK(N >= 0 && OC >= 0, "add_bias_residual: bad sizes N=" << N << " OC=" << OC);
  const std::int64_t n = N * OC;
  if (n == 0 || (bias == nullptr && residual == nullptr)) return;
  const bool vec = aligned16(out) && aligned16(residual);
  const std::int64_t nvec = vec ? n / kVec : 0;
  const unsigned blocks = blocks_for(nvec + (n - nvec * kVec));
  dispatch(dt, "add_bias_residual", [&]<typename T>() {
    add_bias_residual_kernel<T><<<blocks, kThreads, 0, stream>>>(
        static_cast<T*>(out), static_cast<const T*>(bias), static_cast<const T*>(residual), n, OC, nvec);
  });
  DS_CUDA_CHECK_LAUNCH();
}

std::size_t bias_scratch_floats(std::int64_t N, std::int64_t OC) {
  return OC > 0 ? std::size_t(col_chunks(N) * OC) : 0;
}

void bias_backward(void* dbias, const void* dout, std::int64_t N, std::int64_t OC, float* scratch, DType dt,
                   cudaStream_t stream) {
  DS_CHECK(N >= 0 && OC >= 0, "bias_backward: bad sizes N=" << N << " OC=" << OC);
  if (N == 0 || OC == 0 || dbias == nullptr) return;
  DS_CHECK(scratch != nullptr, "bias_backward: null scratch");
  const std::int64_t chunks = col_chunks(N);
  const std::int64_t rows_per_chunk = ceil_div(N, chunks);
  const dim3 grid(unsigned(ceil_div(OC, kColX)), unsigned(chunks));
  const dim3 block(kColX, kColY);
  dispatch(dt, "bias_backward", [&]<typename T>() {
    bias_partial_kernel<T><<<grid, block, 0, stream>>>(scratch, static_cast<const T*>(dout), N, OC, rows_per_chunk);
    DS_CUDA_CHECK_LAUNCH();
    // One 32-column tile per block, 16 warps splitting the chunks (3 blocks looping over the
    // tiles made bias grad 50% slower in the GPT step on an H200).
    reduce_chunks_add_kernel<T><<<unsigned(ceil_div(OC, kWarp)), kReduceThreads, 0, stream>>>(static_cast<T*>(dbias),
                                                                                             scratch, chunks, OC);
    DS_CUDA_CHECK_LAUNCH();
  });
}

void gelu_forward(void* out, const void* inp, std::int64_t n, DType dt, cudaStream_t stream) {
  launch_map<GeluFwd>("gelu_forward", out, inp, nullptr, n, dt, stream);
}

void gelu_backward(void* dinp, const void* inp, const void* dout, std::int64_t n, DType dt, cudaStream_t stream) {
  launch_map<GeluBwd>("gelu_backward", dinp, inp, dout, n, dt, stream);
}

void mean(float* out, const float* x, std::int64_t n, cudaStream_t stream) {
  DS_CHECK(n >= 0, "mean: negative size " << n);
  mean_kernel<<<1, kMeanThreads, 0, stream>>>(out, x, n);
  DS_CUDA_CHECK_LAUNCH();
}

void convert(void* dst, DType dt_dst, const void* src, DType dt_src, std::int64_t n, cudaStream_t stream) {
  DS_CHECK(n >= 0, "convert: negative size " << n);
  if (n == 0) return;
  if (dt_dst == dt_src) {
    dispatch(dt_dst, "convert", [&]<typename T>() {});  // validates the dtype
    DS_CUDA_CHECK(cudaMemcpyAsync(dst, src, std::size_t(n) * dtype_size(dt_dst), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  const bool vec = aligned16(dst) && aligned16(src);
  const std::int64_t nvec = vec ? n / kVec : 0;
  const unsigned blocks = blocks_for(nvec + (n - nvec * kVec));
  dispatch(dt_dst, "convert (destination)", [&]<typename D>() {
    dispatch(dt_src, "convert (source)", [&]<typename S>() {
      convert_kernel<D, S><<<blocks, kThreads, 0, stream>>>(static_cast<D*>(dst), static_cast<const S*>(src), n, nvec);
    });
  });
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::nn::cuda
