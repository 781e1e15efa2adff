// DeviceStore: the engine's flat storage on a CUDA device (the GPU path, docs/dev/gpu.md).
//
// For a module whose device() is Cuda the engine keeps the working parameters, the bound
// gradients and the fp32 master of its slice here; the optimizer state lives in the
// optimizer (Kernel::Cuda). The host buffers of the engine (params_, master_) remain the
// staging copies for initial values and checkpoints: download() / upload() move them.
// Everything is enqueued on the module's stream, so the optimizer step follows backward and
// the next forward follows the step without any event; the calls that return host values
// (grad_stats, download) synchronise that stream.
//
// Built without CUDA, the constructor throws a ds::Error saying so.
#pragma once

#include <cstddef>

#include "ds/core/buffer.h"
#include "ds/precision/grad_stats.h"

namespace ds::engine {

class DeviceStore {
 public:
  // padded_numel elements of params and grads in wdtype; master_count fp32 master elements.
  DeviceStore(std::size_t padded_numel, DType wdtype, std::size_t master_count, void* stream);
  ~DeviceStore();
  DeviceStore(const DeviceStore&) = delete;
  DeviceStore& operator=(const DeviceStore&) = delete;

  void* stream() const { return stream_; }
  TensorView params(std::size_t offset, std::size_t count) const;
  TensorView grads(std::size_t offset, std::size_t count) const;
  float* master() const { return master_; }
  std::size_t bytes() const;  // device bytes held here (params + grads + master)

  // Host -> device: working params (padded_numel, wdtype) and master (master_count fp32).
  void upload(const HostBuffer& params, const HostBuffer& master);
  // Device -> host, after the stream's work so far (synchronous).
  void download(HostBuffer& params, HostBuffer& master) const;
  void download_params(HostBuffer& params) const;  // the working params only
  void zero_grads();
  // Sum of squares and inf/NaN of grads [offset, offset + count) (synchronous).
  precision::GradStats grad_stats(std::size_t offset, std::size_t count);
  void synchronize() const;

 private:
  void release();  // frees everything (destructor, failed constructor)

  std::size_t n_ = 0, master_n_ = 0;
  DType wdtype_ = DType::F32;
  void* stream_ = nullptr;
  void* params_ = nullptr;
  void* grads_ = nullptr;
  float* master_ = nullptr;
  double* d_sumsq_ = nullptr;   // grad_stats results on the device...
  int* d_found_inf_ = nullptr;
  void* h_stats_ = nullptr;     // ... and their pinned host copy
};

}  // namespace ds::engine
