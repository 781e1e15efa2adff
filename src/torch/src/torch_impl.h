// TorchModule's state, shared by the files of ds_torch (load, batch, module, frontend).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/script.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/module.h"
#include "ds/torch/torch_module.h"

namespace ds::torch {

// Where the parameters and the loss come from: a TorchScript file (torch_load.cpp) or a C++
// torch::nn::Module with the user's loss function (torch_frontend.cpp). The rest of the
// adapter (views, hooks, checks) is the same for both.
class ModelSource {
 public:
  virtual ~ModelSource() = default;
  // named_parameters(), recursively, in order; the tensors are the module's own.
  virtual std::vector<std::pair<std::string, at::Tensor>> named_parameters() = 0;
  virtual void to(at::ScalarType dtype) = 0;
  virtual void train(bool on) = 0;
  // The micro-batch's loss from the batch tensors (checked by the caller as a scalar).
  virtual at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) = 0;
  // A model given as a sequence of blocks (torch_blocks.h): one group per block with
  // parameters, in the order forward runs them. Empty for any other model.
  virtual std::vector<ParamGroup> parameter_groups() const { return {}; }
  // loss() computed block by block, each block's run bracketed by `hooks` (Pass::Forward)
  // and followed by `ran`. Only for a source with parameter_groups().
  virtual at::Tensor loss_by_blocks(const at::Tensor& inputs, const at::Tensor& targets, GroupHooks* hooks,
                                    const std::function<void(std::size_t, const at::Tensor&)>& ran) {
    (void)inputs, (void)targets, (void)hooks, (void)ran;
    DS_THROW("the model is not a sequence of blocks: it has no block-by-block forward");
  }
};

struct TorchModule::Impl {
  std::string path;  // the model file, or the C++ module's name: what errors name
  std::unique_ptr<ModelSource> source;
  std::vector<std::string> names;  // named_parameters() order
  std::vector<at::Tensor> params;  // the module's parameter tensors (their data is rebound)
  std::vector<ParamInfo> infos;
  // The engine's storage after bind(); backward checks .grad still points there.
  std::vector<void*> param_ptrs, grad_ptrs;
  at::ScalarType working = at::kFloat;
  // Gradient accumulators held alive (a parameter keeps only a weak reference, so a hook on
  // an accumulator nobody holds would vanish with it) and which of them fired this backward.
  std::vector<std::shared_ptr<::torch::autograd::Node>> accumulators;  // null: frozen parameter
  std::vector<std::uintptr_t> hook_keys;
  std::vector<char> reported;
  const std::function<void(std::size_t)>* grad_ready = nullptr;  // set during backward only
  bool training = true;

  // ZeRO stage 3 over a sequence of blocks (torch_groups.cpp): the source's groups, and the
  // engine's hooks once set. In backward a block's group is acquired by a hook on the
  // gradient of its output (it fires just before the block's backward runs) and released
  // when the last of its parameters reports its gradient (or at the end of backward).
  std::vector<ParamGroup> groups;
  GroupHooks* hooks = nullptr;
  std::vector<std::size_t> group_of;       // parameter -> its group
  std::vector<std::size_t> grads_pending;  // per group: hooked parameters not yet reported
  std::vector<char> held;                  // per group: acquired for Backward, not released
  bool by_blocks() const { return hooks && !groups.empty(); }
  void take_groups();                                        // groups, group_of (construction)
  // The source's loss: block by block when the engine brackets groups, else its forward.
  at::Tensor source_loss(const at::Tensor& inputs, const at::Tensor& targets, bool need_grad);
  void begin_backward_groups();                              // grads_pending, held
  void after_block(std::size_t g, const at::Tensor& output);  // forward: the backward hook
  void group_reported(std::size_t i);                        // release g once all reported
  void end_backward_groups() noexcept;                       // release what is still held

  // The hook's call: reports parameter i once per backward (and nothing outside backward).
  void ready(std::size_t i) {
    if (!grad_ready || reported[i]) return;
    reported[i] = 1;
    (*grad_ready)(i);
    if (by_blocks()) group_reported(i);
  }
  void set_training(bool want) {
    if (training == want) return;
    source->train(want);
    training = want;
  }
  // After backward: every .grad and parameter is still the engine's memory (else ds::Error).
  void check_still_bound() const;
  // The batch's mean loss from the source (torch_batch.cpp), checked against the contract.
  at::Tensor forward_loss(const Batch& batch, bool need_grad);
  at::Tensor loss;  // forward's, for backward

  // Takes the source's parameters (names, shapes, fp32 check): the constructors' common part.
  void take_parameters();
};

// Loads the file and checks forward's signature (torch_load.cpp).
std::unique_ptr<ModelSource> load_script(const std::string& path);
// The cross-entropy of logits [*targets' shape, classes] against class ids (torch_batch.cpp).
at::Tensor logits_loss(const at::Tensor& logits, const at::Tensor& targets, const std::string& path);

}  // namespace ds::torch
