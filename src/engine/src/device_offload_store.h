// ZeRO-Offload on the GPU path (zero_optimization.offload_optimizer.device "cpu";
// docs/dev/gpu.md "The offloaded step"): the device keeps the working parameters and the
// gradients and runs forward and backward; the fp32 master and the optimizer state of the
// rank's slice stay in host memory and the CPU optimizer (Kernel::Cpu) steps them.
//
// Two parts:
//   HostOffloadStep: the host side of one step, pure C++ (no CUDA), driven through an
//     OffloadCopier so that a memcpy fake can test it on the CPU;
//   OffloadDeviceParamStore: the ParamStore that owns the device and host buffers and gives
//     HostOffloadStep a copier over the module's stream (device_offload_store.cpp).
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/optim/optimizer.h"
#include "param_store.h"

namespace ds::engine {

// The device copies of an offloaded step, over element ranges [begin, begin + count) of the
// rank's step range (element 0 is ParamStore::step_offset()). piece is the sub-group's index.
class OffloadCopier {
 public:
  virtual ~OffloadCopier() = default;
  // Starts copying the gradients of the range from the device into the host gradient copy.
  virtual void grads_to_host(std::size_t piece, std::size_t begin, std::size_t count) = 0;
  // Returns once grads_to_host(piece, ...) has landed in host memory.
  virtual void wait_grads(std::size_t piece) = 0;
  // Starts copying the updated working params of the range from the host staging buffer to
  // the device (the "copy back" of a finished sub-group).
  virtual void params_to_device(std::size_t piece, std::size_t begin, std::size_t count) = 0;
  // Returns once every params_to_device started so far has read the staging buffer.
  virtual void wait_params() = 0;
};

// One optimizer step over a partition held in host memory, in sub-groups of `sub_group`
// elements (0: one sub-group), so that the copies overlap the CPU step:
//   1. wait for the previous step's params_to_device (they read the staging buffer);
//   2. grads_to_host for every sub-group, all enqueued at once (the device runs them back to
//      back while the host steps);
//   3. for each sub-group i in order: wait_grads(i); Optimizer::step_piece over its master,
//      state (the optimizer's own arrays, offset), host gradients and staging (the same
//      kernels and results as one step over the whole partition: gradients scaled by
//      ctx.grad_scale, master and state in place, new working params written in the same
//      fused pass); params_to_device(i). So sub-group i goes back to the device while
//      sub-group i+1 is stepped, and sub-group i+2's gradients may still be arriving.
//   Lamb (its trust ratio needs whole tensors): every wait_grads, ONE opt.step over the
//   partition with the segments, then every params_to_device.
// Nothing waits for the copies back here (on the device they precede whatever is enqueued
// next on the same stream).
class HostOffloadStep {
 public:
  HostOffloadStep(std::size_t n, std::size_t sub_group);
  std::size_t size() const { return n_; }
  std::size_t pieces() const { return pieces_; }
  // [begin, begin + count) of sub-group i.
  std::pair<std::size_t, std::size_t> piece(std::size_t i) const;

  // master: n fp32 (host); grads: the host gradient copy, n elements of the working dtype;
  // staging: n elements of the working dtype, written with the updated working params; it
  // must already hold the current working params of the elements the optimizer does not
  // write (Lamb's elements outside every segment), which are copied back too.
  // opt: a Kernel::Cpu optimizer after init_state(n); segments relative to the partition
  // (Lamb's; the elementwise optimizers ignore them).
  void step(optim::Optimizer& opt, std::span<float> master, TensorView grads, TensorView staging,
            std::span<const optim::Segment> segments, const optim::StepContext& ctx, OffloadCopier& copier) const;

 private:
  std::size_t n_ = 0, sub_ = 0, pieces_ = 0;
};

// A range [lo, hi) of the rank's step range already on its way to the host, and the event
// (a cudaEvent_t) recorded after its copy.
struct EarlyCopy {
  std::size_t lo = 0, hi = 0;
  void* event = nullptr;
};
// Whether the ranges together cover [lo, hi) (they are disjoint: one per gradient bucket).
bool covered_by(std::span<const EarlyCopy> ranges, std::size_t lo, std::size_t hi);

// DeviceParamStore's device params, grads, grad_stats and gather; no device master: the fp32
// master is ParamStore::master_ (host), the optimizer state is the Kernel::Cpu optimizer's
// own (host) arrays, and the step goes through HostOffloadStep. The host gradient copy and
// the staging buffer are pinned (cudaMallocHost) with `pin_memory`, else pageable. Built
// without CUDA, construction throws as DeviceParamStore's does.
class OffloadDeviceParamStore final : public DeviceParamStore {
 public:
  // Sub-groups are at least this many bytes of the working dtype, whatever sub_group_size says:
  // smaller copies would be dominated by their launch cost.
  static constexpr std::size_t kMinPieceBytes = std::size_t(4) << 20;

  OffloadDeviceParamStore(const PartitionMap& map, int rank, const StoreOptions& o, void* stream);
  ~OffloadDeviceParamStore() override;
  void optimizer_step(optim::Optimizer& opt, optim::StepContext ctx) override;
  void add_memory(ModelStateBytes& b) const override;
  // Each bucket's part of this rank's range goes to the host on a copy stream as soon as its
  // reduction completes on the device (CommHandle::order_stream), overlapping the rest of
  // backward; the step then waits only for the copies of the sub-group it steps.
  void grads_reducing(std::size_t begin, std::size_t count, CommHandle& work) override;
  void zero_grads() override;  // DeviceParamStore's, after the early copies read the gradients

 protected:
  void upload() override;  // DeviceParamStore's, then the staging buffer from the host params

 private:
  void release_host();  // frees the host buffers (destructor, failed constructor)
  void drop_early();     // the module's stream waits for the early copies; their events go

  void* copy_stream_ = nullptr;  // cudaStream_t of the early gradient copies
  std::vector<EarlyCopy> early_;  // this cycle's early copies

  HostOffloadStep plan_;
  std::unique_ptr<OffloadCopier> copier_;
  void* h_grads_ = nullptr;    // step_count() x wdtype: the gradients of the rank's range
  void* h_staging_ = nullptr;  // step_count() x wdtype: the updated working params
  bool pinned_ = false;
  HostBuffer pageable_grads_, pageable_staging_;  // their storage when not pinned
};

}  // namespace ds::engine
