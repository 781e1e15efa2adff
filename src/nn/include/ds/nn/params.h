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
  // Only parameters [first, first + count) (one ZeRO-3 group, converted inside its bracket).
  void prepare_forward(std::size_t first, std::size_t count);
  // Working dtype half: zero the fp32 gradient shadow (of the parameters not direct).
  void prepare_backward();
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

  // fp32 view of parameter i / of its gradient accumulator (valid after bind()).
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
};

// Deterministic initializers (same values on every platform: own RNG, own normal sampler).
// Each parameter draws from its own stream derived from (seed, stream).
void init_normal(std::span<float> out, float stddev, std::uint64_t seed, std::uint64_t stream);
void init_uniform(std::span<float> out, float bound, std::uint64_t seed, std::uint64_t stream);
void init_constant(std::span<float> out, float value);

}  // namespace ds::nn
