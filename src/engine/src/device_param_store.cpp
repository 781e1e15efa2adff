#include "device_store.h"

#include "ds/core/error.h"

#if DS_PRECISION_HAVE_CUDA
#include <cuda_runtime.h>

#include "ds/core/cuda_check.h"
#include "ds/precision/cuda_kernels.h"
#endif

namespace ds::engine {

#if DS_PRECISION_HAVE_CUDA

namespace {
cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
struct HostStats {
  double sumsq;
  int found_inf;
};
}  // namespace

DeviceStore::DeviceStore(std::size_t padded_numel, DType wdtype, std::size_t master_count, void* stream)
    : n_(padded_numel), master_n_(master_count), wdtype_(wdtype), stream_(stream) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) cudaGetLastError();
  DS_CHECK(rc == cudaSuccess && count > 0, "the module runs on a CUDA device but no CUDA device is visible ("
                                               << (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices")
                                               << "): train it on the CPU, or where a GPU is visible");
  try {
    const std::size_t wb = std::max<std::size_t>(n_, 1) * dtype_size(wdtype_);
    DS_CUDA_CHECK(cudaMalloc(&params_, wb));
    DS_CUDA_CHECK(cudaMalloc(&grads_, wb));
    DS_CUDA_CHECK(cudaMalloc(&master_, std::max<std::size_t>(master_n_, 1) * sizeof(float)));
    DS_CUDA_CHECK(cudaMalloc(&d_sumsq_, sizeof(double)));
    DS_CUDA_CHECK(cudaMalloc(&d_found_inf_, sizeof(int)));
    DS_CUDA_CHECK(cudaMallocHost(&h_stats_, sizeof(HostStats)));
    DS_CUDA_CHECK(cudaMemsetAsync(params_, 0, wb, as_stream(stream_)));
    DS_CUDA_CHECK(cudaMemsetAsync(grads_, 0, wb, as_stream(stream_)));
  } catch (...) {
    release();
    throw;
  }
}

DeviceStore::~DeviceStore() { release(); }

void DeviceStore::release() {
  // No checks: also runs while an exception unwinds.
  if (stream_) cudaStreamSynchronize(as_stream(stream_));
  cudaFree(params_);
  cudaFree(grads_);
  cudaFree(master_);
  cudaFree(d_sumsq_);
  cudaFree(d_found_inf_);
  cudaFreeHost(h_stats_);
  params_ = grads_ = nullptr;
  master_ = nullptr;
  d_sumsq_ = nullptr;
  d_found_inf_ = nullptr;
  h_stats_ = nullptr;
}

TensorView DeviceStore::params(std::size_t offset, std::size_t count) const {
  return TensorView{static_cast<char*>(params_) + offset * dtype_size(wdtype_), count, wdtype_};
}
TensorView DeviceStore::grads(std::size_t offset, std::size_t count) const {
  return TensorView{static_cast<char*>(grads_) + offset * dtype_size(wdtype_), count, wdtype_};
}
std::size_t DeviceStore::bytes() const { return 2 * n_ * dtype_size(wdtype_) + master_n_ * sizeof(float); }

void DeviceStore::upload(const HostBuffer& params, const HostBuffer& master) {
  DS_CHECK(params.bytes() >= n_ * dtype_size(wdtype_) && master.bytes() >= master_n_ * sizeof(float),
           "DeviceStore::upload: host buffers smaller than the device storage");
  // Pageable host memory: the copies are staged, so the host buffers may change afterwards.
  DS_CUDA_CHECK(cudaMemcpyAsync(params_, params.data(), n_ * dtype_size(wdtype_), cudaMemcpyHostToDevice,
                                as_stream(stream_)));
  DS_CUDA_CHECK(cudaMemcpyAsync(master_, master.data(), master_n_ * sizeof(float), cudaMemcpyHostToDevice,
                                as_stream(stream_)));
  synchronize();
}

void DeviceStore::download(HostBuffer& params, HostBuffer& master) const {
  DS_CHECK(master.bytes() >= master_n_ * sizeof(float),
           "DeviceStore::download: host master smaller than the device master");
  DS_CUDA_CHECK(cudaMemcpyAsync(master.data(), master_, master_n_ * sizeof(float), cudaMemcpyDeviceToHost,
                                as_stream(stream_)));
  download_params(params);  // synchronises, so the master copy is complete too
}

void DeviceStore::download_params(HostBuffer& params) const {
  DS_CHECK(params.bytes() >= n_ * dtype_size(wdtype_),
           "DeviceStore::download: host params smaller than the device params");
  DS_CUDA_CHECK(cudaMemcpyAsync(params.data(), params_, n_ * dtype_size(wdtype_), cudaMemcpyDeviceToHost,
                                as_stream(stream_)));
  synchronize();
}

void DeviceStore::zero_grads() {
  DS_CUDA_CHECK(cudaMemsetAsync(grads_, 0, n_ * dtype_size(wdtype_), as_stream(stream_)));
}

precision::GradStats DeviceStore::grad_stats(std::size_t offset, std::size_t count) {
  cudaStream_t s = as_stream(stream_);
  DS_CUDA_CHECK(cudaMemsetAsync(d_sumsq_, 0, sizeof(double), s));
  DS_CUDA_CHECK(cudaMemsetAsync(d_found_inf_, 0, sizeof(int), s));
  if (count > 0) precision::cuda::grad_stats(grads(offset, count), d_sumsq_, d_found_inf_, s);
  auto* h = static_cast<HostStats*>(h_stats_);
  DS_CUDA_CHECK(cudaMemcpyAsync(&h->sumsq, d_sumsq_, sizeof(double), cudaMemcpyDeviceToHost, s));
  DS_CUDA_CHECK(cudaMemcpyAsync(&h->found_inf, d_found_inf_, sizeof(int), cudaMemcpyDeviceToHost, s));
  synchronize();
  precision::GradStats st;
  st.has_inf_or_nan = h->found_inf != 0;
  st.sum_of_squares = h->sumsq;
  return st;
}

void DeviceStore::synchronize() const { DS_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream_))); }

#else  // built without CUDA

DeviceStore::DeviceStore(std::size_t, DType, std::size_t, void*) {
  DS_THROW("the module runs on a CUDA device but dstrain was built without CUDA (DS_WITH_CUDA): "
           "rebuild with the CUDA toolkit, or train on the CPU");
}
DeviceStore::~DeviceStore() = default;
void DeviceStore::release() {}
TensorView DeviceStore::params(std::size_t, std::size_t) const { return {}; }
TensorView DeviceStore::grads(std::size_t, std::size_t) const { return {}; }
std::size_t DeviceStore::bytes() const { return 0; }
void DeviceStore::upload(const HostBuffer&, const HostBuffer&) {}
void DeviceStore::download(HostBuffer&, HostBuffer&) const {}
void DeviceStore::download_params(HostBuffer&) const {}
void DeviceStore::zero_grads() {}
precision::GradStats DeviceStore::grad_stats(std::size_t, std::size_t) { return {}; }
void DeviceStore::synchronize() const {}

#endif

}  // namespace ds::engine
