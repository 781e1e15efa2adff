// What the device stores (DeviceParamStore, DevicePartitionedParamStore) share to compute the
// gradient statistics of a boundary step. CUDA builds only (DS_PRECISION_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>

#include "ds/core/cuda_check.h"
#include "ds/core/module.h"
#include "ds/precision/cuda_kernels.h"
#include "ds/precision/grad_stats.h"

namespace ds::engine {

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Counts a host synchronisation of a device store (device_stream_syncs(), param_store.h).
void note_device_stream_sync();

// The pinned host copy of the device results (cudaMallocHost(sizeof(DeviceStatsHost))).
struct DeviceStatsHost {
  double sumsq;
  int found_inf;
};

// Enqueues the sum of squares and inf/NaN of `grads` (nothing when empty) on stream s into
// d_sumsq / d_found_inf (zeroed first). No host synchronisation.
inline void enqueue_device_grad_stats(TensorView grads, double* d_sumsq, int* d_found_inf, cudaStream_t s) {
  DS_CUDA_CHECK(cudaMemsetAsync(d_sumsq, 0, sizeof(double), s));
  DS_CUDA_CHECK(cudaMemsetAsync(d_found_inf, 0, sizeof(int), s));
  if (grads.count > 0) precision::cuda::grad_stats(grads, d_sumsq, d_found_inf, s);
}

// The synchronous path's statistics: enqueued as above, copied to the pinned `host`; synchronises
// the stream and returns them.
inline precision::GradStats device_grad_stats(TensorView grads, double* d_sumsq, int* d_found_inf, void* host,
                                              cudaStream_t s) {
  enqueue_device_grad_stats(grads, d_sumsq, d_found_inf, s);
  auto* h = static_cast<DeviceStatsHost*>(host);
  DS_CUDA_CHECK(cudaMemcpyAsync(&h->sumsq, d_sumsq, sizeof(double), cudaMemcpyDeviceToHost, s));
  DS_CUDA_CHECK(cudaMemcpyAsync(&h->found_inf, d_found_inf, sizeof(int), cudaMemcpyDeviceToHost, s));
  note_device_stream_sync();
  DS_CUDA_CHECK(cudaStreamSynchronize(s));
  precision::GradStats st;
  st.has_inf_or_nan = h->found_inf != 0;
  st.sum_of_squares = h->sumsq;
  return st;
}

}  // namespace ds::engine
