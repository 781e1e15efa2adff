// Private device helpers of the optimizer kernels: loads and stores of 1 or 8 elements (8:
// ds/core/cuda_vec.cuh's 128-bit transactions), the (grad, working) dtype dispatch, launch sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ds/core/cuda_check.h"
#include "ds/core/cuda_convert.cuh"
#include "ds/core/cuda_vec.cuh"
#include "ds/core/error.h"
#include "ds/optim/cuda_kernels.h"
#include "elem_math.h"

namespace ds::optim::cuda::detail {

constexpr int kIlp = 8;         // elements per thread per iteration
constexpr int kThreads = 256;

struct NoWorking {};  // the "no working copy" type

using ds::cuda::from_f;
using ds::cuda::to_f;

// K = 1: one element; K = 8: load8 / store8 (ds/core/cuda_vec.cuh), 16-byte alignment.
template <int K, typename T>
__device__ __forceinline__ void load(const T* p, std::size_t i, float (&r)[K]) {
  if constexpr (K == 1) r[0] = to_f(p[i]);
  else ds::cuda::load8(p, i, r);
}

template <int K, typename T>
__device__ __forceinline__ void store(T* p, std::size_t i, const float (&r)[K]) {
  if constexpr (K == 1) p[i] = from_f<T>(r[0]);
  else ds::cuda::store8(p, i, r);
}

__device__ __forceinline__ float device_grad_scale(float host_scale, const DeviceStepControl& c) {
  return c.d_grad_scale ? host_scale * *c.d_grad_scale : host_scale;
}

using ds::cuda::aligned16;

inline unsigned blocks_for(std::size_t work_items) {
  return ds::cuda::grid_blocks(std::int64_t(work_items), kThreads, 65535);
}

// Calls f.template operator()<G, W>() with the CUDA element types of the views.
template <class F>
void dispatch(const TensorView& g, const TensorView& w, F&& f) {
  auto with_w = [&]<typename G>() {
    if (w.data == nullptr) return f.template operator()<G, NoWorking>();
    switch (w.dtype) {
      case DType::F32: return f.template operator()<G, float>();
      case DType::F16: return f.template operator()<G, __half>();
      case DType::BF16: return f.template operator()<G, __nv_bfloat16>();
      default: DS_THROW("CUDA optimizer: working dtype must be fp32, fp16 or bf16, got " << dtype_name(w.dtype));
    }
  };
  switch (g.dtype) {
    case DType::F32: return with_w.template operator()<float>();
    case DType::F16: return with_w.template operator()<__half>();
    case DType::BF16: return with_w.template operator()<__nv_bfloat16>();
    default: DS_THROW("CUDA optimizer: gradient dtype must be fp32, fp16 or bf16, got " << dtype_name(g.dtype));
  }
}

// The elementwise driver: Op::template apply<K>(i, g[K], p[K]) updates its state and p.
template <class Op, typename G, typename W>
__global__ void elementwise_kernel(Op op, const G* __restrict__ g, W* __restrict__ w, float* __restrict__ p,
                                   std::size_t n, std::size_t nvec, DeviceStepControl ctl) {
  if (ctl.d_skip != nullptr && *ctl.d_skip != 0) return;
  op.prepare(ctl);
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t tid = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (std::size_t t = tid; t < nvec; t += stride) {
    const std::size_t i = t * kIlp;
    float gr[kIlp], pr[kIlp];
    load<kIlp>(g, i, gr);
    load<kIlp>(p, i, pr);
    op.template apply<kIlp>(i, gr, pr);
    store<kIlp>(p, i, pr);
    if constexpr (!std::is_same_v<W, NoWorking>) store<kIlp>(w, i, pr);
  }
  for (std::size_t i = nvec * kIlp + tid; i < n; i += stride) {  // guarded tail
    float gr[1], pr[1];
    load<1>(g, i, gr);
    load<1>(p, i, pr);
    op.template apply<1>(i, gr, pr);
    store<1>(p, i, pr);
    if constexpr (!std::is_same_v<W, NoWorking>) store<1>(w, i, pr);
  }
}

// The views' shape checks of the CPU kernels (scalar_math.h), on the host before a launch.
inline void check_views(const TensorView& g, const TensorView& w, std::size_t n, const char* who) {
  DS_CHECK(g.count >= n && (g.data != nullptr || n == 0),
           who << " (CUDA): gradient view holds " << g.count << " elements, the step needs " << n);
  DS_CHECK(w.data == nullptr || w.count >= n,
           who << " (CUDA): working view holds " << w.count << " elements, the step needs " << n);
}

// Launches the driver; the 8-wide path only when every pointer is 16-byte aligned.
template <class Op>
void launch_elementwise(const Op& op, float* p, const TensorView& g, const TensorView& w, std::size_t n,
                        std::initializer_list<const void*> state, const DeviceStepControl& ctl, cudaStream_t s) {
  if (n == 0) return;
  bool al = aligned16(p) && aligned16(g.data) && aligned16(w.data);
  for (const void* q : state) al = al && aligned16(q);
  const std::size_t nvec = al ? n / kIlp : 0;
  const unsigned blocks = blocks_for(al ? nvec + (n % kIlp) : n);
  dispatch(g, w, [&]<typename G, typename W>() {
    elementwise_kernel<Op, G, W><<<blocks, kThreads, 0, s>>>(op, static_cast<const G*>(g.data), static_cast<W*>(w.data),
                                                             p, n, nvec, ctl);
  });
  DS_CUDA_CHECK_LAUNCH();
}

}  // namespace ds::optim::cuda::detail
