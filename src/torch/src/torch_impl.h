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

  // The hook's call: reports parameter i once per backward (and nothing outside backward).
  void ready(std::size_t i) {
    if (!grad_ready || reported[i]) return;
    reported[i] = 1;
    (*grad_ready)(i);
  }
  // After backward: every .grad and parameter is still the engine's memory (else ds::Error).
  void check_still_bound() const;
  at::Tensor loss;  // forward's, for backward
  bool checked_loss = false;
};

// Loads the file and checks forward's signature (torch_load.cpp).
::torch::jit::Module load_checked(const std::string& path);
// The forward arguments for a batch: float inputs in the working dtype (torch_batch.cpp).
std::vector<c10::IValue> batch_inputs(const Batch& batch, at::ScalarType working, const std::string& path);
// Checks forward's result is a scalar floating-point loss and returns it (torch_batch.cpp).
at::Tensor checked_loss(const c10::IValue& out, bool need_grad, const std::string& path);

}  // namespace ds::torch
