// ParamSet: the bookkeeping every built-in model shares -- the parameter list, the views the
// engine binds, and the fp32 compute copies used when the working dtype is fp16 or bf16.
//
// fp32 working dtype: the kernels read the bound parameters and accumulate straight into the
// bound gradients (no copies). fp16 / bf16: prepare_forward() converts all parameters once
// into an fp32 shadow; backward accumulates into a zeroed fp32 shadow gradient and
// finish_grad(i) adds it into the bound half gradient (fp32 add, one rounding) before telling
// the engine the gradient is ready. A parameter marked set_direct_grad(i, true) skips the
// shadow gradient: its kernel adds into the bound half gradient itself (the same single
// rounding), so it is neither zeroed nor folded (the Linear weights: ~98% of a GPT's).
//
// Without group hooks (ZeRO stages 0-2, a model used alone) the shadows cover the whole model
// (allocated at the first prepare_forward / prepare_backward). With hooks (stage 3, see
// set_group_hooks) a rank must never hold the whole model, so the shadows hold only the groups
// in use: the model brackets with the hooks set_group_hooks returns, which wrap the engine's.
// A group's first acquire takes a slot from a small pool (slots grow to the largest group they
// have held and are reused), points w(i) / g(i) into it and converts the group's parameters;
// a Backward acquire also zeroes the shadow gradients not yet zeroed in this backward. The
// last release gives the slot back, unless a gradient of the group is still unfolded (the
// tied embedding: the LM head accumulates into it at the start of backward, the embedding
// at the end) -- then the slot stays until that gradient is folded, so every gradient is
// still summed in fp32 and rounded once: the same bits as the whole-model shadows. The
// shadows then take about 2 x 8 bytes x the largest group (shadow_bytes()), not 8 x the model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/module.h"

namespace ds::nn {

class ParamSet {
 public:

  // Registers a parameter; returns its index.
  std::size_t add(std::string name, std::vector<std::int64_t> shape);
  const std::vector<ParamInfo>& infos() const { return infos_; }
  std::size_t size() const { return infos_.size(); }
  std::size_t total_numel() const { return total_; }
  // Parameter i's offset in a flat array of all parameters in registration order (the fp32
  // shadows' layout).
  std::size_t offset(std::size_t i) const { return offsets_[i]; }

  // Checks counts and dtypes against the registered parameters (names the offender).
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads);
  bool bound() const { return bound_; }
  DType dtype() const { return dtype_; }

  // Working dtype half: refresh the fp32 copies of the parameters.
  void prepare_forward() { prepare_forward(0, infos_.size()); }
  // Only parameters [first, first + count) (one ZeRO-3 group, inside its bracket). With group
  // hooks the bracket's acquire has converted them already: this only checks they are held.
  void prepare_forward(std::size_t first, std::size_t count);
  // Working dtype half: zero the fp32 gradient shadow (of the parameters not direct). With
  // group hooks: a new backward starts (each group's shadow gradient is zeroed at its first
  // Backward acquire from here on; a slot still kept from an earlier backward is dropped).
  void prepare_backward();

  // ZeRO stage 3: `hooks` non-null switches to per-group shadows for `groups` (they tile the
  // parameters in order) and returns the hooks the model must bracket with (they call
  // `hooks` and then manage the shadows; valid while this ParamSet lives). Null switches back
  // to whole-model shadows and returns null. Either way the results keep the same bits.
  // (Call it again after moving the ParamSet: the returned hooks point back at it.)
  GroupHooks* set_group_hooks(GroupHooks* hooks, const std::vector<ParamGroup>& groups);
  // Host bytes the fp32 shadows hold now (whole-model shadows, or the slot pool, which only
  // grows); 0 for fp32.
  std::size_t shadow_bytes() const;
  // Working dtype half: parameter i's backward kernel accumulates into half_grad(i) itself.
  // Ignored for fp32. Set before prepare_backward().
  void set_direct_grad(std::size_t i, bool on);
  bool direct_grad(std::size_t i) const { return dtype_ != DType::F32 && direct_[i]; }
  // The bound gradient storage of parameter i (the engine's, in the working dtype).
  void* bound_grad(std::size_t i) const { return grads_[i].data; }
  // Gradient of parameter i is complete: fold the shadow into the bound gradient (half
  // dtypes) and call ready(i).
  void finish_grad(std::size_t i, const std::function<void(std::size_t)>& ready);
  // The fold alone (half dtypes; nothing for fp32 or a direct gradient), for a caller that
  // folds on one thread and reports on another.
  void fold_grad(std::size_t i);

  // fp32 view of parameter i / of its gradient accumulator (valid after bind() for fp32,
  // after prepare_forward() for half dtypes, and with group hooks only while i's group is
  // acquired; null otherwise).
  float* w(std::size_t i) const { return w_[i]; }
  float* g(std::size_t i) const { return g_[i]; }

 private:
  std::vector<ParamInfo> infos_;
  std::vector<std::size_t> offsets_;
  std::size_t total_ = 0;
  bool bound_ = false;
  DType dtype_ = DType::F32;
  std::vector<TensorView> params_, grads_;
  std::vector<float*> w_, g_;
  std::vector<char> direct_;  // per parameter: see set_direct_grad
  HostBuffer shadow_w_, shadow_g_;

  // Whole-model shadows (no hooks, half dtype): allocate them once and point w_/g_ there
  // (not at bind(): a stage-3 engine binds before it sets the hooks, and the whole-model
  // shadows must never be touched there).
  void ensure_whole();
  bool whole_bound_ = false;  // w_/g_ point into shadow_w_/shadow_g_
  // Parameters [first, first + count) from the bound half storage into w_.
  void convert_range(std::size_t first, std::size_t count);
  bool staged() const { return outer_ != nullptr && dtype_ != DType::F32; }
  void acquire_group(std::size_t group, Pass pass);
  void release_group(std::size_t group, Pass pass) noexcept;
  std::size_t take_slot(std::size_t numel);
  void drop_slot(std::size_t group);  // w_/g_ of its parameters to null, slot back to the pool

  // The hooks handed to the model (set_group_hooks): forward to outer_, then manage slots.
  class Bracket : public GroupHooks {
   public:
    explicit Bracket(ParamSet* ps) : ps_(ps) {}
    void rebind(ParamSet* ps) { ps_ = ps; }
    void acquire(std::size_t group, Pass pass) override { ps_->acquire_group(group, pass); }
    void release(std::size_t group, Pass pass) noexcept override { ps_->release_group(group, pass); }

   private:
    ParamSet* ps_;
  };
  struct Slot {
    HostBuffer buf;  // capacity floats of parameters, then capacity floats of gradients
    std::size_t capacity = 0;
    bool busy = false;
  };
  struct GroupState {
    ParamGroup group;
    std::size_t numel = 0;
    int held = 0;   // open brackets
    int slot = -1;  // into slots_, or none
  };
  // Per parameter, within one backward: gradient shadow not yet zeroed / zeroed and open /
  // folded.
  enum GradState : char { kUnzeroed = 0, kOpen = 1, kFolded = 2 };
  GroupHooks* outer_ = nullptr;
  Bracket bracket_{this};
  std::vector<GroupState> groups_;
  std::vector<std::size_t> group_of_;  // per parameter
  std::vector<char> grad_state_;      // per parameter: GradState
  std::vector<Slot> slots_;
};

// Deterministic initializers (same values on every platform: own RNG, own normal sampler).
// Each parameter draws from its own stream derived from (seed, stream).
void init_normal(std::span<float> out, float stddev, std::uint64_t seed, std::uint64_t stream);
void init_uniform(std::span<float> out, float bound, std::uint64_t seed, std::uint64_t stream);
void init_constant(std::span<float> out, float value);

}  // namespace ds::nn
