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

  // The hook's call: reports parameter i once per backward (and nothing outside backward).
  void ready(std::size_t i) {
    if (!grad_ready || reported[i]) return;
    reported[i] = 1;
    (*grad_ready)(i);
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
