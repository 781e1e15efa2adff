// Zero3Store: what ZeRO stage 3's GroupFetcher (zero3_fetcher.h) and the engine ask of a
// stage-3 parameter store, wherever its memory is: PartitionedParamStore in host memory
// (zero3_store.h) or DevicePartitionedParamStore on a CUDA device (device_zero3_store.h).
//
// The fetcher keeps the bookkeeping -- trace, prefetch, persistence, reuse distance, the
// collective order -- and never looks at the bytes; what depends on where they are goes
// through these calls. On the host each is what the fetcher did itself before (pages fault
// in on first write, are given back at once with madvise, the fold is add_into_f32, gathers
// are waited on the host). On a device (docs/dev/gpu.md "ZeRO-3 on the device"): chunks are
// mapped before anything writes them, given back only behind compute-stream events, the fold
// is a kernel, and the compute stream is ordered behind a gather instead of the host waiting.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ds/core/error.h"
#include "ds/mpi/communicator.h"
#include "param_store.h"

namespace ds::engine {

class Zero3Store : public ParamStore {
 public:
  // ---- the engine's calls ----
  // Group g's initial values alone (its padded range, fp32 in host memory): this rank keeps its
  // piece.
  virtual void set_initial_group(std::size_t g, const float* group_values) = 0;
  // Copies group g's working-params piece to dst (host memory, or, for a device store, host
  // or device memory), complete when the call returns.
  virtual void read_part_params(std::size_t g, void* dst) const = 0;
  // The communicator the fetcher gathers over (params_fp32() is collective over it).
  void set_comm(Communicator* comm) { comm_ = comm; }

  // ---- the fetcher's calls ----
  // This rank's piece of group g's working params, where the store keeps it (the all-gather's
  // send buffer).
  virtual TensorView part_params(std::size_t g) const = 0;
  // offload_param nvme (host only): the piece is in the parameter swap file, read
  // asynchronously (NvmeSwap::start_read_params).
  virtual bool params_swapped() const { return false; }
  virtual std::uint64_t start_read_part_params(std::size_t, void*) {
    DS_THROW("stage 3: this store keeps no parameter swap file");
  }
  virtual void finish_read_part_params(std::uint64_t) {}
  // Group g's flat parameters are about to be written by a gather (device: mapped; a release
  // still queued for them is cancelled).
  virtual void params_needed(std::size_t /*g*/) {}
  // Group g's flat parameters are not used by anything enqueued from now on: give them back
  // (host: now; device: once the compute stream has run past this call).
  virtual void release_params(std::size_t g) = 0;
  // Backward (or the reduce-scatter) is about to write / read group g's flat gradients: a
  // device maps them, reading zero where newly mapped.
  virtual void grads_needed(std::size_t /*g*/) {}
  // Group g's flat gradients are reduced and folded: give them back.
  virtual void release_grads(std::size_t g) = 0;
  // This rank's fp32 gradient piece of group g += reduced (piece elements, any float dtype,
  // where the store lives).
  virtual void fold(std::size_t g, TensorView reduced) = 0;
  // True: the compute stream is ordered behind a gather (order_after) instead of the host
  // waiting for it at acquire; the gather's handle is still waited later, in order.
  virtual bool orders_on_device() const { return false; }
  virtual void order_after(CommHandle& work) { work.wait(); }
  // stage3_max_live_parameters (elements): a device store bounds what it keeps mapped, queued
  // releases included.
  virtual void set_live_limit(std::size_t /*elements*/) {}
  // Reduce-scatter receive slots, `bytes`, owned by the store, where it lives.
  virtual void* reduce_scratch(std::size_t bytes) = 0;

 protected:
  using ParamStore::ParamStore;
  Communicator* comm_ = nullptr;
};

}  // namespace ds::engine
