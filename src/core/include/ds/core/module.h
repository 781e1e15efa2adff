// The contract between the engine and a model: a user's own model and the built-in ones
// (src/nn) implement the same interface, and the engine sees models only through it.
//
// Call order, per micro-batch: forward(batch) then backward(scale, grad_ready). Parameters
// and gradients live in engine-owned flat storage that the engine hands over once with
// bind(); the module reads parameters and accumulates (+=) gradients through those views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "ds/core/buffer.h"

namespace ds {

struct ParamInfo {
  std::string name;                 // "h.0.attn.c_attn.weight": stable, used in checkpoints
  std::vector<std::int64_t> shape;  // row-major
  std::size_t numel() const {
    return std::accumulate(shape.begin(), shape.end(), std::size_t{1},
                           [](std::size_t a, std::int64_t d) { return a * std::size_t(d); });
  }
};

// One micro-batch. Memory belongs to the caller. Token models read inputs/targets (batch x
// seq, row-major). Feature models read `batch` samples of features, each of sample_shape
// (empty: {feature_dim}), and per sample either integer targets (class ids) in `targets` or
// float targets in `target_values`, each of target_shape (empty: one value per sample).
struct Batch {
  std::span<const std::int32_t> inputs;
  std::span<const std::int32_t> targets;
  std::span<const float> features;
  std::span<const float> target_values;
  std::span<const std::int64_t> sample_shape;
  std::span<const std::int64_t> target_shape;
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::int64_t feature_dim = 0;
};

// Where a module computes, and so where the engine keeps the storage it binds.
enum class Device : std::uint8_t { Cpu, Cuda };

// ZeRO stage 3 partitions the parameters themselves: each rank keeps 1/N of every group and
// the engine gathers a group just before the module uses it and frees it after. A group is a
// run of consecutive parameters in parameters() order that the module uses together (the
// GPT: the embeddings, each block, the final norm); groups tile parameters() in order, each
// non-empty.
struct ParamGroup {
  std::string name;       // "h.3" (messages, reports)
  std::size_t first = 0;  // index of its first parameter in parameters()
  std::size_t count = 0;  // parameters in the group
};

enum class Pass : std::uint8_t { Forward, Backward };

// The engine's side of the group protocol (stage 3; set with Module::set_group_hooks). A
// module that declares groups brackets every use of a group's parameters -- reading them,
// and in backward also accumulating into their gradients -- with acquire(g) ... release(g)
// of the pass it is in (forward, evaluate and generation: Forward; backward, including any
// recomputation there: Backward). Brackets may nest, and a group may be acquired more than
// once per pass (a tied weight: the GPT's head acquires the embeddings' group again).
// Outside its brackets a group's parameter and gradient views must not be touched: under
// stage 3 their memory is released, and under stage 2 on a CUDA device a gradient view has
// no device memory behind it until its group is acquired in Backward (an illegal address
// otherwise). Both calls come from the thread that runs forward and backward; release() does
// not throw.
class GroupHooks {
 public:
  virtual ~GroupHooks() = default;
  virtual void acquire(std::size_t group, Pass pass) = 0;
  virtual void release(std::size_t group, Pass pass) noexcept = 0;
};

// acquire() on construction, release() on destruction; does nothing when hooks is null (no
// stage 3, or a module used without an engine).
class GroupUse {
 public:
  GroupUse(GroupHooks* hooks, std::size_t group, Pass pass) : hooks_(hooks), group_(group), pass_(pass) {
    if (hooks_) hooks_->acquire(group_, pass_);
  }
  ~GroupUse() {
    if (hooks_) hooks_->release(group_, pass_);
  }
  GroupUse(const GroupUse&) = delete;
  GroupUse& operator=(const GroupUse&) = delete;

 private:
  GroupHooks* hooks_;
  std::size_t group_;
  Pass pass_;
};

class ModuleProfile;

class Module {
 public:
  virtual ~Module() = default;

  // Cpu (default): bind() hands host pointers. Cuda: bind() hands DEVICE pointers on the
  // current CUDA device, and the engine keeps parameters, gradients, the fp32 master and the
  // optimizer state on that device, reduces gradients over NCCL and steps there.
  virtual Device device() const { return Device::Cpu; }
  // Cuda modules: the cudaStream_t (as void*, keeping CUDA headers out of this header) their
  // forward and backward enqueue on. The engine orders its gradient reduction and optimizer
  // step after the work enqueued there, and its parameter updates before the next forward.
  // A grad_ready(i) call may come before the gradient's kernels have run on this stream.
  virtual void* device_stream() const { return nullptr; }

  // Parameters in a fixed order; the engine lays them out in this order.
  virtual std::vector<ParamInfo> parameters() const = 0;

  // Writes initial fp32 values into params[i] (parameters()[i].numel() floats each).
  // Called on every rank; the engine then broadcasts rank 0's values so replicas start equal.
  // (ZeRO stage 3 on several ranks: called on rank 0 only, which sends each rank its pieces.)
  virtual void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) = 0;
  // Optional: the same initial values for parameters()[first, first + params.size()) alone.
  // A module whose parameters are initialised independently of each other (each from the seed
  // and its own index) returns true; then ZeRO stage 3 initialises one parameter group at a
  // time, so not even rank 0 holds the whole model in fp32. The default returns false and the
  // engine calls init_parameters over the whole model instead.
  virtual bool init_parameter_range(std::size_t /*first*/, std::span<const std::span<float>> /*params*/,
                                    std::uint64_t /*seed*/) {
    return false;
  }

  // Engine-owned storage for parameters()[i]: params[i] and grads[i] have the same working
  // dtype (fp32, fp16 or bf16) and stay valid until the next bind().
  virtual void bind(std::span<const TensorView> params, std::span<const TensorView> grads) = 0;

  // Computes the mean loss of the micro-batch, caching what backward needs.
  virtual float forward(const Batch& batch) = 0;

  // Accumulates scale * d(loss)/d(param) into the bound gradients (+=, never overwrite:
  // the engine zeroes them after each optimizer step). Calls grad_ready(i) once per
  // parameter when its gradient for this micro-batch is final, so the engine can start
  // reducing a full bucket while the rest of backward runs. `scale` folds in the loss scale
  // and 1/gradient_accumulation_steps.
  virtual void backward(float scale, const std::function<void(std::size_t)>& grad_ready) = 0;

  // Loss without caching for backward (validation). Default: forward().
  virtual float evaluate(const Batch& batch) { return forward(batch); }

  // ZeRO stage 3: the parameter groups in execution order (see ParamGroup). Default: none,
  // and the engine treats the whole model as one group, gathered around each forward and
  // backward call -- correct for any module, but without the memory saving of stage 3 while
  // the module runs.
  virtual std::vector<ParamGroup> parameter_groups() const { return {}; }
  // Called once by a stage-3 engine (and by a stage-2 engine of a CUDA module with several
  // ranks, which maps gradient memory at Backward acquires, and sets nullptr when it ends),
  // after bind() and before the first forward, with hooks that outlive every later
  // forward/backward call; a module that declares groups keeps the pointer and calls it as
  // GroupHooks says (GroupUse does the bracketing). Default: ignored.
  virtual void set_group_hooks(GroupHooks* /*hooks*/) {}

  // Optional, for the flops profiler (ds/core/module_profile.h). Non-null: the module writes
  // its module tree into *profile (replacing what is there) and returns true; from then on
  // until the call with nullptr, each forward() adds each module's MACs and the elapsed time
  // of its own ops. Called between forward/backward calls, on the thread that runs them.
  // Default: false (no tree; the profiler prints its summary alone).
  virtual bool set_module_profile(ModuleProfile* /*profile*/) { return false; }
};

}  // namespace ds
