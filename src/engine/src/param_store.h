// ParamStore: the engine's flat parameter storage, where it lives (docs/dev/engine.md "The
// parameter store").
//
// One flat space (engine::PartitionMap) holds every parameter end to end. The store owns
// the working parameters and the bound gradients over that space, the fp32 master (and,
// with data_types.grad_accum_dtype fp32, the fp32 accumulation buffer) of this rank's
// slice, and does everything that depends on where those bytes are: views of ranges, the
// gradient statistics (overflow / norm), the optimizer call, the parameter gather after the
// step, zeroing the gradients, dtype conversions, and the host staging copies checkpoints
// read and write. HostParamStore keeps it all in host memory; DeviceParamStore on a CUDA
// device (the GPU path, docs/dev/gpu.md). The engine holds one and never asks which.
//
// Ranges are GLOBAL element offsets into the flat (padded) space, so a later stage that
// partitions the parameters themselves can ask for one layer group's range at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/error.h"
#include "ds/core/module.h"
#include "ds/engine/memory.h"
#include "ds/engine/partition.h"
#include "ds/mpi/communicator.h"
#include "ds/optim/optimizer.h"
#include "ds/precision/grad_stats.h"
#include "ds/precision/step_decision.h"
#include "device_paged_buffer.h"
#include "grad_pages.h"
#include "nvme_swap.h"

namespace ds::engine {

class DeviceAsyncStep;  // device_step.h (CUDA builds)

struct StoreOptions {
  DType wdtype = DType::F32;        // working params and grads
  bool accum_fp32 = false;          // data_types.grad_accum_dtype fp32 with a half wdtype
  bool release_grads = false;       // ZeRO-2 with more than one rank (see HostParamStore,
                                    // DeviceParamStore)
  std::size_t gather_chunk = 0;     // elements per rank per all-gather (0: no gather)
  // zero_optimization.offload_optimizer device cpu on a CUDA device: master and optimizer
  // state in host memory (device_offload_store.h), copies in sub_group-element pieces
  // (0: one piece) through pinned (pin_memory) or pageable host buffers.
  bool offload_optimizer = false;
  std::size_t sub_group = 0;
  bool pin_memory = true;
  NvmeOptions nvme;                 // offload_optimizer / offload_param device nvme (host stores)
};

class ParamStore {
 public:
  // A HostParamStore, a PartitionedParamStore (stage 3, zero3_store.h), or a
  // DeviceParamStore for a module on a CUDA device.
  static std::unique_ptr<ParamStore> make(const PartitionMap& map, int rank, const StoreOptions& o, Module& module);
  virtual ~ParamStore() = default;
  ParamStore(const ParamStore&) = delete;
  ParamStore& operator=(const ParamStore&) = delete;

  const PartitionMap& map() const { return map_; }
  const RankSlice& slice() const { return slice_; }
  DType wdtype() const { return o_.wdtype; }
  bool partitioned() const { return map_.stage >= 1; }
  // The range this rank steps: its slice's real elements (ZeRO) or the whole model.
  std::size_t step_offset() const { return partitioned() ? slice_.offset : 0; }
  std::size_t step_count() const { return partitioned() ? slice_.real_count : map_.total_numel; }

  // Working params / bound gradients [offset, offset + count) where they live.
  virtual TensorView params(std::size_t offset, std::size_t count) const = 0;
  virtual TensorView grads(std::size_t offset, std::size_t count) const = 0;

  // Once, after make() and before set_initial(): the optimizer whose state the step range
  // needs -- sized in memory (init_state), or, with offload_optimizer nvme, in swap files
  // (the master too). Creates the NVMe swap files (nvme_swap.h) when either offload asks.
  void attach_optimizer(optim::Optimizer& opt);
  // Initial values: `full` holds the whole padded flat space in fp32 (the same on every rank).
  virtual void set_initial(const float* full);
  // After every backward: fold the micro-step gradients into the fp32 accumulator (accum_fp32).
  virtual void after_backward() {}
  // After Module::bind: the module has looked at its views (GptCuda and LlamaCuda ask the
  // runtime whether each is device memory, which an unmapped ZeRO-2 chunk is not); see
  // DeviceParamStore.
  virtual void views_bound() {}
  // Sum of squares and inf/NaN of the gradients this rank steps (the accumulator with accum_fp32).
  virtual precision::GradStats grad_stats() = 0;
  // One optimizer update of this rank's range: master and working params from its gradients.
  virtual void optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) = 0;
  // The boundary step without a host synchronisation (docs/dev/engine.md "The boundary
  // step"): true when this store can enqueue the whole decision and update on its device
  // (launch_step), the host reading the outcome later (finish_step). The host store, and a
  // device store whose optimizer runs on the host (ZeRO-Offload), take the synchronous path:
  // grad_stats(), a host all-reduce, precision::decide_step, optimizer_step.
  virtual bool async_step() const { return false; }
  // Enqueues, in stream order: the gradient statistics into device scalars; with stats_comm
  // (several ranks) their sum over the ranks on the stream; precision::decide_step on the
  // device (`in`: the host's part, the non-finite loss flag included); the optimizer update of
  // this rank's range driven by the device's skip flag and grad_scale (ctx: lr, step, betas;
  // its grad_scale is ignored); with gather_comm (ZeRO 1/2, several ranks) the non-blocking
  // gather of the working params (of unchanged slices after a skip: harmless); an asynchronous
  // copy of the decision into pinned host memory and an event. No host synchronisation. One
  // launch at a time, each followed by finish_step.
  virtual void launch_step(optim::Optimizer& /*opt*/, optim::StepContext /*ctx*/, const precision::StepInputs& /*in*/,
                           Communicator* /*stats_comm*/, Communicator* /*gather_comm*/) {
    DS_THROW("this parameter store has no asynchronous boundary step");
  }
  // The launched step's decision: waits for its event (the device finished it long ago,
  // normally) and for the statistics' all-reduce handle.
  virtual precision::StepDecision finish_step() { DS_THROW("this parameter store has no asynchronous boundary step"); }
  // ZeRO: every rank gets every rank's updated slice of the working params.
  virtual void gather_params(Communicator& comm) = 0;
  // The gradients read zero for the next backward.
  virtual void zero_grads() = 0;
  // The reducer launched the reduction of the gradients [begin, begin + count) (global flat
  // range), which `work` completes. The GPU path's ZeRO-Offload store starts copying this
  // rank's part of them to the host behind it, while the rest of backward runs.
  virtual void grads_reducing(std::size_t /*begin*/, std::size_t /*count*/, CommHandle& /*work*/) {}

  // Host staging copies (checkpoints): working params (padded_numel x wdtype) and the fp32
  // master of this rank's slice. to_host() refreshes them from where the store lives;
  // from_host() sends them back (and the optimizer state when it was loaded).
  HostBuffer& host_params() { return params_; }
  HostBuffer& host_master() { return master_; }
  // The fp32 master (step_count() elements) and the optimizer state where checkpoints read
  // and write them: host_master() and opt.state_tensors(), or with offload_optimizer nvme the
  // swap files mapped into memory, valid until done_with_state_views() (`written`: the
  // caller wrote through them -- a checkpoint load; the stage-3 store then rounds its working
  // partition from the same views before they end, so the master is read once).
  StateViews state_views(optim::Optimizer& opt);
  virtual void done_with_state_views(bool written);
  // NVMe offload: the swap buffers and the bytes on disk.
  void add_swap_memory(ModelStateBytes& b) const;
  const NvmeSwap* nvme() const { return swap_.get(); }
  virtual void to_host(optim::Optimizer&) {}
  virtual void from_host(optim::Optimizer&, bool /*with_optimizer_state*/) {}
  virtual std::vector<float> params_fp32() const;  // full fp32 copy, unpadded

  // Bytes held for params, grads (and the accumulator), master and gather staging.
  virtual void add_memory(ModelStateBytes& b) const = 0;
  // Host gradient pages (ZeRO-2 page release); nullptr when the gradients are on a device.
  virtual PagedBuffer* grad_pages() { return nullptr; }
  // The gradient buffer as ZeRO-2 releases it (grad_pages.h): the host pages, or a device
  // store's chunks at stage 2 with several ranks; nullptr for device gradients in one
  // ordinary allocation.
  virtual GradPages* grad_space() { return nullptr; }
  // Byte range of grad_space() that is never released (this rank's slice under ZeRO-2).
  std::pair<std::size_t, std::size_t> kept_bytes() const { return {keep_lo_, keep_hi_}; }
  // The device stream the store's work is enqueued on (nullptr on the host).
  virtual void* stream() const { return nullptr; }

 protected:
  ParamStore(const PartitionMap& map, int rank, const StoreOptions& o);
  virtual void upload() {}  // after set_initial: host staging -> where the store lives

  const PartitionMap& map_;
  int rank_ = 0;
  RankSlice slice_;
  StoreOptions o_;
  std::vector<optim::Segment> segments_;  // parameter pieces of slice_, as the optimizer's Segments
  HostBuffer params_;  // padded_numel x wdtype: the working params (host) / their staging copy
                       // (device); empty at stage 3, where no rank holds them whole
  HostBuffer master_;  // slice_.count x F32; element j is global flat element slice_.offset + j
                       // (empty with offload_optimizer nvme: swap_ holds it)
  std::unique_ptr<NvmeSwap> swap_;  // NVMe offload (attach_optimizer), else null
  bool master_swapped() const { return swap_ && swap_->optimizer(); }
  std::size_t keep_lo_ = 0, keep_hi_ = 0;
};

// Host memory. Gradients: a PagedBuffer with address space for the whole flat space (the
// Module contract binds one view per parameter). Stages 0/1 (and one rank): all pages
// touched once and kept. ZeRO-2 (release_grads): only the pages of this rank's slice stay
// resident; the GradReducer releases every other page as soon as its bucket is reduced,
// so it reads as zero for the next backward.
class HostParamStore final : public ParamStore {
 public:
  HostParamStore(const PartitionMap& map, int rank, const StoreOptions& o);
  TensorView params(std::size_t offset, std::size_t count) const override;
  TensorView grads(std::size_t offset, std::size_t count) const override;
  void after_backward() override;
  precision::GradStats grad_stats() override;
  void optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) override;
  void gather_params(Communicator& comm) override;
  void zero_grads() override;
  void add_memory(ModelStateBytes& b) const override;
  PagedBuffer* grad_pages() override { return &grads_; }
  GradPages* grad_space() override { return &grad_space_; }

 private:
  TensorView step_grads(std::size_t offset, std::size_t count) const;  // accum_ or grads_

  PagedBuffer grads_;
  HostGradPages grad_space_{grads_};  // grads_ under GradPages' names (the member, so it
                                      // follows the assignment in the constructor)
  HostBuffer accum_;        // slice_.count x F32 with accum_fp32, else empty
  HostBuffer gather_recv_;  // all-gather staging, W x gather_chunk x wdtype, when chunks < a slice
};

// A CUDA device: params, grads and master in device memory, the optimizer state in the
// optimizer (Kernel::Cuda). Everything is enqueued on the module's stream, so the step
// follows backward and the next forward follows the step without any event; the calls that
// return host values (grad_stats, to_host, params_fp32) synchronise that stream. Built
// without CUDA, the constructor throws a ds::Error saying so (device_param_store.cpp).
// Gradients: one allocation; ZeRO-2 (release_grads) a DevicePagedBuffer instead, in which
// only the chunks of this rank's slice stay mapped and the GradReducer maps the others as
// backward writes them and unmaps them once their bucket is reduced (grad_space()).
class DeviceParamStore : public ParamStore {
 public:
  DeviceParamStore(const PartitionMap& map, int rank, const StoreOptions& o, void* stream);
  ~DeviceParamStore() override;
  TensorView params(std::size_t offset, std::size_t count) const override;
  TensorView grads(std::size_t offset, std::size_t count) const override;
  precision::GradStats grad_stats() override;
  void optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) override;
  bool async_step() const override;
  void launch_step(optim::Optimizer& opt, optim::StepContext ctx, const precision::StepInputs& in,
                   Communicator* stats_comm, Communicator* gather_comm) override;
  precision::StepDecision finish_step() override;
  void gather_params(Communicator& comm) override;
  void zero_grads() override;
  void to_host(optim::Optimizer& opt) override;
  void from_host(optim::Optimizer& opt, bool with_optimizer_state) override;
  std::vector<float> params_fp32() const override;
  void add_memory(ModelStateBytes& b) const override;
  GradPages* grad_space() override { return grad_space_.get(); }
  // ZeRO-2: the chunks holding each parameter's first gradient element are mapped from the
  // constructor until here (so that bind's pointer checks see device memory); now only the
  // slice's stay.
  void views_bound() override;
  void* stream() const override { return stream_; }

 protected:
  void upload() override;

  // Protected for OffloadDeviceParamStore (device_offload_store.h), which keeps no d_master_.
  void download_params(HostBuffer& params) const;
  void synchronize() const;
  void release();  // frees everything (destructor, failed constructor)

  std::size_t n_ = 0, master_n_ = 0;
  void* stream_ = nullptr;
  void* d_params_ = nullptr;
  void* d_grads_ = nullptr;                        // grad_pages_->data() with ZeRO-2
  std::unique_ptr<DevicePagedBuffer> grad_pages_;  // ZeRO-2 only
  std::unique_ptr<GradPages> grad_space_;          // grad_pages_ under GradPages' names
  float* d_master_ = nullptr;
  double* d_sumsq_ = nullptr;  // grad_stats results on the device...
  int* d_found_inf_ = nullptr;
  void* h_stats_ = nullptr;    // ... and their pinned host copy
  std::unique_ptr<DeviceAsyncStep> async_;  // the asynchronous boundary step's scalars (device_step.h)
};

// OffloadDeviceParamStore (device_offload_store.h): ParamStore::make's choice for a CUDA
// module with StoreOptions::offload_optimizer. Throws without CUDA in the build.
std::unique_ptr<ParamStore> make_offload_device_store(const PartitionMap& map, int rank, const StoreOptions& o,
                                                      void* stream);

}  // namespace ds::engine
