// acc += float(src) on the device (device_fold.h): stage 3 folds each reduced gradient piece
// into the fp32 partition on the compute stream, behind the reduce-scatter that wrote it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>

#include "device_fold.h"
#include "ds/core/cuda_check.h"
#include "ds/core/cuda_convert.cuh"
#include "ds/core/error.h"

namespace ds::engine::cuda {
namespace {

template <typename T>
__global__ void add_kernel(float* __restrict__ acc, const T* __restrict__ src, std::size_t n) {
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc[i] += ds::cuda::to_f(src[i]);
}

template <typename T>
void launch(float* acc, const void* src, std::size_t n, cudaStream_t s) {
  constexpr int kThreads = 256;
  const std::size_t want = (n + kThreads - 1) / kThreads;
  const unsigned blocks = unsigned(want < 65535 ? want : 65535);  // grid-stride beyond that
  add_kernel<T><<<blocks, kThreads, 0, s>>>(acc, static_cast<const T*>(src), n);
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace

void add_into_f32(float* acc, TensorView src, void* stream) {
  if (src.count == 0) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (src.dtype) {
    case DType::F32: return launch<float>(acc, src.data, src.count, s);
    case DType::F16: return launch<__half>(acc, src.data, src.count, s);
    case DType::BF16: return launch<__nv_bfloat16>(acc, src.data, src.count, s);
    default:
      DS_THROW("stage 3 on the device: adding " << dtype_name(src.dtype) << " gradients into fp32: unsupported dtype");
  }
}

}  // namespace ds::engine::cuda
