// A C++ torch::nn::Module (libtorch's frontend) and a loss function, trained by the engine as
// a ds::TorchModule. This header includes libtorch's: link the program to libtorch as well.
//
// The contract is TorchModule's (ds/torch/torch_module.h) with the loss function in place of
// the scripted forward: loss(module, inputs, targets) returns the micro-batch's mean loss, a
// floating-point scalar that depends on the parameters. inputs and targets are as the
// scripted forward gets them (float inputs [batch, *sample_shape] in the working dtype, fp32
// or int64 targets; int64 [batch, seq] for tokens), the module's own copies. Parameters are
// module->named_parameters() in that order, with those names; the initial values are the
// module's own. The adapter shares the module: after bind() its parameters' data and .grad
// are the engine's storage, so the caller must not replace them (checked after backward),
// nor call an optimizer on it. Errors name "C++ module NAME" (module->name()).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "ds/torch/torch_module.h"

namespace ds::torch {

using LossFn =
    std::function<at::Tensor(::torch::nn::Module& module, const at::Tensor& inputs, const at::Tensor& targets)>;

// The adapter over `module` and `loss`; throws ds::Error for a module without parameters or
// with parameters that are not fp32.
std::unique_ptr<TorchModule> from_module(std::shared_ptr<::torch::nn::Module> module, LossFn loss);

// The same with the loss function taking the module's own type, e.g.
//   from_module(std::make_shared<Net>(), [](Net& net, const at::Tensor& x, const at::Tensor& y) {
//     return ::torch::mse_loss(net.forward(x), y); });
template <class M, class F>
  requires std::is_base_of_v<::torch::nn::Module, M> && std::is_invocable_r_v<at::Tensor, F&, M&, const at::Tensor&,
                                                                                const at::Tensor&>
std::unique_ptr<TorchModule> from_module(std::shared_ptr<M> module, F loss) {
  LossFn erased = [loss = std::move(loss)](::torch::nn::Module& m, const at::Tensor& inputs,
                                           const at::Tensor& targets) {
    return loss(static_cast<M&>(m), inputs, targets);
  };
  return from_module(std::shared_ptr<::torch::nn::Module>(std::move(module)), std::move(erased));
}

}  // namespace ds::torch
