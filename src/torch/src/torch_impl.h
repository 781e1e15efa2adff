// TorchModule's state, shared by the files of ds_torch (load, batch, module).
#pragma once

#include <torch/csrc/autograd/function.h>
#include <torch/script.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/module.h"
#include "ds/torch/torch_module.h"

namespace ds::torch {

struct TorchModule::Impl {
  std::string path;
  ::torch::jit::Module module;
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
  bool returns_logits = false;  // forward(inputs) -> logits, not forward(inputs, targets) -> loss

  // The hook's call: reports parameter i once per backward (and nothing outside backward).
  void ready(std::size_t i) {
    if (!grad_ready || reported[i]) return;
    reported[i] = 1;
    (*grad_ready)(i);
  }
  // After backward: every .grad and parameter is still the engine's memory (else ds::Error).
  void check_still_bound() const;
  // The batch's mean loss through the scripted forward: its own loss, or the cross-entropy
  // of its logits against the class ids (torch_batch.cpp). Checked against the contract.
  at::Tensor forward_loss(const Batch& batch, bool need_grad);
  at::Tensor loss;  // forward's, for backward
};

// A loaded module and which form of forward it has.
struct LoadedModule {
  ::torch::jit::Module module;
  bool returns_logits = false;
};
// Loads the file and checks forward's signature (torch_load.cpp).
LoadedModule load_checked(const std::string& path);

}  // namespace ds::torch
