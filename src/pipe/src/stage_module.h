// A pipeline stage's part of a layer-sequence model (ds/core/layer_sequence.h) as the
// ds::Module its Engine trains: the parameters are those the stage's layers own, in the
// model's order and with the model's names, so the engine's storage, optimizer state and
// checkpoints hold exactly the stage's share.
//
// One model instance per pipe buffer: 1F1B keeps up to stages - stage_id micro-batches
// between their forward and their backward, and a layer sequence keeps one range's
// activations at a time, so each buffer runs on its own instance. All instances bind the
// same storage (they hold activations only). The pipe engine selects a buffer and its
// activation spans before each forward/backward call.
//
// Parameters the stage does not own are never touched by its range: they are bound to an
// inaccessible reservation (a touch is a crash, not silent garbage). A tied weight the stage
// uses but another stage owns (the GPT's embedding matrix, used by the head) lives here, in
// the working dtype, outside the engine: the pipe engine sends its gradient to the owner and
// receives its updated values after each step.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/layer_sequence.h"
#include "ds/core/module.h"

namespace ds::pipe {

class StageModule : public Module {
 public:
  // `instances`: at least one, all the same model (layer sequences on the CPU); the stage
  // runs layers [first_layer, last_layer).
  StageModule(std::vector<std::unique_ptr<Module>> instances, std::size_t first_layer, std::size_t last_layer);
  ~StageModule() override;

  // The model's parameters() indices this stage owns: [first_param, end_param).
  std::size_t first_param() const { return first_param_; }
  std::size_t end_param() const { return end_param_; }
  // Model parameter indices of the tied weights this stage uses but does not own.
  const std::vector<std::size_t>& foreign_tied() const { return foreign_; }
  // Their storage (working dtype, valid after bind()).
  TensorView foreign_param(std::size_t model_index) const { return foreign_view(foreign_values_, model_index); }
  TensorView foreign_grad(std::size_t model_index) const { return foreign_view(foreign_grads_, model_index); }
  // The engine's storage of an owned parameter (valid after bind()).
  TensorView bound_param(std::size_t model_index) const { return params_.at(model_index - first_param_); }
  TensorView bound_grad(std::size_t model_index) const { return grads_.at(model_index - first_param_); }
  LayerSequence& sequence(int buffer = 0) const { return *seqs_.at(std::size_t(buffer)); }
  int buffers() const { return int(instances_.size()); }

  // What the next forward/backward call of `buffer` reads and writes (LayerSequence's spans).
  struct Io {
    std::span<const float> input;
    std::span<float> output;
    std::span<const float> output_grad;
    std::span<float> input_grad;
  };
  void select(int buffer, const Io& io);
  // Called with the model index of an owned parameter other stages also use, just before
  // its grad_ready goes to the engine (the pipe engine adds their gradient there).
  // A module of the whole model's parameters whose init_parameters gives the initial weights
  // (init_parameters then takes the stage's share of them); null: the instances' own init.
  void set_initial_values(Module* whole) { initial_values_ = whole; }
  void set_before_shared_ready(std::function<void(std::size_t)> hook) { before_shared_ready_ = std::move(hook); }
  // Model indices of the tied weights this stage owns and other stages use.
  const std::vector<std::size_t>& shared_owned() const { return shared_owned_; }

  // ds::Module
  std::vector<ParamInfo> parameters() const override;
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  float evaluate(const Batch& batch) override { return forward(batch); }
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  // ZeRO stage 3: one group per layer of the stage (the model's groups are its layers); the
  // instances bracket them as the whole model does, through hooks that pass the stage's
  // groups to the engine and ignore the others (a foreign tied weight is always here).
  std::vector<ParamGroup> parameter_groups() const override;
  void set_group_hooks(GroupHooks* hooks) override;
  // Brackets a use of owned parameter `model_index` outside forward/backward (stage 3: its
  // group gathered until the returned object goes; otherwise nothing).
  std::unique_ptr<GroupUse> use_group_of(std::size_t model_index, Pass pass) const;

 private:
  TensorView foreign_view(const std::vector<HostBuffer>& buffers, std::size_t model_index) const;
  void bind_instances(DType dtype, std::span<const TensorView> params, std::span<const TensorView> grads);

  std::vector<std::unique_ptr<Module>> instances_;
  std::vector<LayerSequence*> seqs_;
  std::vector<ParamInfo> model_params_;
  std::vector<LayerSpec> layers_;  // the model's layers (the instances all have these)
  std::size_t first_layer_ = 0, last_layer_ = 0;
  std::size_t first_param_ = 0, end_param_ = 0;
  std::vector<std::size_t> foreign_;       // model indices, ascending
  std::vector<std::size_t> shared_owned_;  // model indices
  std::vector<TensorView> params_, grads_;  // the engine's views of the owned parameters
  std::vector<HostBuffer> foreign_values_, foreign_grads_;  // by position in foreign_
  class StageHooks;
  std::unique_ptr<StageHooks> stage_hooks_;
  GroupHooks* engine_hooks_ = nullptr;
  struct Reservation;
  std::unique_ptr<Reservation> absent_;  // inaccessible views for parameters of other stages
  Module* initial_values_ = nullptr;
  int buffer_ = 0;
  Io io_;
  std::function<void(std::size_t)> before_shared_ready_;
};

}  // namespace ds::pipe
