// What the device stores (DeviceParamStore, DevicePartitionedParamStore) share to compute the
// gradient statistics the engine reads once per step. CUDA builds only (DS_PRECISION_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include "ds/core/cuda_check.h"
#include "ds/core/module.h"
#include "ds/precision/cuda_kernels.h"
#include "ds/precision/grad_stats.h"

namespace ds::engine {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// The pinned host copy of the device results (cudaMallocHost(sizeof(DeviceStatsHost))).
struct DeviceStatsHost {
  double sumsq;
  int found_inf;
};

// Sum of squares and inf/NaN of `grads` (nothing when empty) on stream s into d_sumsq /
// d_found_inf, copied to the pinned `host`; synchronises the stream and returns them.
inline precision::GradStats device_grad_stats(TensorView grads, double* d_sumsq, int* d_found_inf, void* host,
                                              cudaStream_t s) {
  DS_CUDA_CHECK(cudaMemsetAsync(d_sumsq, 0, sizeof(double), s));
  DS_CUDA_CHECK(cudaMemsetAsync(d_found_inf, 0, sizeof(int), s));
  if (grads.count > 0) precision::cuda::grad_stats(grads, d_sumsq, d_found_inf, s);
  auto* h = static_cast<DeviceStatsHost*>(host);
  DS_CUDA_CHECK(cudaMemcpyAsync(&h->sumsq, d_sumsq, sizeof(double), cudaMemcpyDeviceToHost, s));
  DS_CUDA_CHECK(cudaMemcpyAsync(&h->found_inf, d_found_inf, sizeof(int), cudaMemcpyDeviceToHost, s));
  DS_CUDA_CHECK(cudaStreamSynchronize(s));
  precision::GradStats st;
  st.has_inf_or_nan = h->found_inf != 0;
  st.sum_of_squares = h->sumsq;
  return st;
}

}  // namespace ds::engine
