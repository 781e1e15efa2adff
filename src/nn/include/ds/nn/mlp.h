// A multilayer perceptron classifier: features -> [Linear -> GELU] x n_hidden_layers ->
// Linear -> softmax cross-entropy (mean over the batch). Reads Batch.features
// (batch x in_features) and Batch.targets (batch class ids in [0, n_classes)).
//
// Parameters: fc.<i>.weight [hidden, in] / fc.<i>.bias [hidden] for each hidden layer, then
// head.weight [n_classes, hidden] / head.bias [n_classes]. Init as PyTorch's nn.Linear:
// weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
#pragma once

#include <cstdint>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/module.h"
#include "ds/nn/module_trees.h"
#include "ds/nn/params.h"

namespace ds::nn {

struct MlpConfig {
  std::int64_t in_features = 16;
  std::int64_t hidden = 64;
  std::int64_t n_classes = 4;
  std::int64_t n_hidden_layers = 1;
};

class Mlp : public Module {
 public:
  explicit Mlp(const MlpConfig& cfg);

  std::vector<ParamInfo> parameters() const override { return ps_.infos(); }
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;
  // ZeRO-3 groups: one per Linear layer ("fc.0", ..., "head"), weight and bias each.
  std::vector<ParamGroup> parameter_groups() const override;
  // The model brackets with the ParamSet's hooks: they wrap these and keep the fp32 shadows
  // of half dtypes to the groups in use (ParamSet::set_group_hooks).
  void set_group_hooks(GroupHooks* hooks) override { hooks_ = ps_.set_group_hooks(hooks, parameter_groups()); }
  // The flops profiler: fc.N and head (ds/nn/module_trees.h); the GELUs and the loss are the model's own ops.
  bool set_module_profile(ModuleProfile* profile) override;

  const MlpConfig& config() const { return cfg_; }
  // Training FLOPs per sample: 6 * (weights in GEMMs).
  double flops_per_sample() const;
  // Bytes of the activation arena (activations and backward scratch) a batch of B samples
  // allocates.
  std::size_t activation_bytes(std::int64_t B) const { return std::size_t(arena_floats(B)) * sizeof(float); }

 private:
  float run(const Batch& batch);
  std::int64_t arena_floats(std::int64_t B) const;
  void ensure_scratch(std::int64_t B);

  MlpConfig cfg_;
  ParamSet ps_;
  std::vector<std::size_t> w_, b_;  // per linear layer (hidden layers, then head)
  std::vector<std::int64_t> dims_;  // in, hidden..., classes
  GroupHooks* hooks_ = nullptr;
  MlpModules modules_;
  ModuleProfile* mprof_ = nullptr;
  HostBuffer arena_;
  std::int64_t cap_b_ = 0, B_ = 0;
  std::vector<float*> pre_, post_;  // per hidden layer: pre-activation, GELU output
  float *input_ = nullptr, *logits_ = nullptr, *lse_ = nullptr, *dA_ = nullptr, *dB_ = nullptr;
  std::vector<std::int32_t> targets_;
  bool have_cache_ = false;
};

}  // namespace ds::nn
