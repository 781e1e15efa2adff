// ds::torch::TorchModule: a TorchScript module (torch.jit.script(model).save(path)) trained by
// the engine as any ds::Module. No torch header here: libtorch stays inside ds_torch.
//
// The contract for the scripted module, checked when the file is loaded (forward's arity
// says which form it is):
//   forward(self, inputs: Tensor, targets: Tensor) -> Tensor   -- the mean loss, a scalar
// (0-dim or one element, floating point, depending on the parameters), or
//   forward(self, inputs: Tensor) -> Tensor   -- logits [*targets' shape, classes], whose
// mean cross-entropy against the int64 targets (in fp32) is the loss; float targets are an
// error with this form. What the module gets:
//   token batches   inputs int64 [batch, seq], targets int64 [batch, seq]
//   feature batches inputs float [batch, *sample_shape] in the working dtype, and targets
//                   int64 [batch, *target_shape] (class ids) or fp32 [batch, *target_shape]
// The tensors are the module's own copies of the batch: it may keep or change them.
//
// Parameters are named_parameters() in that order, with those names (the checkpoint names);
// buffers (running statistics) are the module's and are not checkpointed. The initial values
// are the module's own (init_parameters ignores the seed; the engine broadcasts rank 0's).
// bind() makes every parameter's data and its .grad views of the engine's storage, so no
// parameter or gradient is copied per step; the module is cast to the working dtype first
// (bf16 / fp16; the engine keeps the fp32 master). backward() runs autograd on loss * scale,
// which accumulates into the bound gradients in place, and reports grad_ready(i) as soon as
// parameter i's gradient is accumulated (a post hook on its gradient accumulator, as PyTorch
// DDP's reducer does), then the parameters that got no gradient (an unused branch), so every
// rank reports every parameter once per micro-batch. After backward the .grad tensors must
// still be the engine's views: a module that replaced them is an error, not silent wrong
// training. forward/backward run in train mode, evaluate in eval mode without autograd.
// libtorch's intra-op threads are set at bind() to ds::cpu_threads() (the rank's share).
// Every libtorch failure reaches the caller as ds::Error naming the file and the call.
//
// ZeRO stage 3: a model given as a sequence of blocks gets one parameter group per block
// with parameters, so only one block's parameters are gathered at a time. The form, read
// off forward's graph at load: forward passes `inputs` through submodules one after the
// other (a top-level nn.Sequential, the items of an nn.ModuleList in a loop, or top-level
// children called in order), each call taking only the previous output (and `targets`, if
// it wants), then computes its result from the last output and `targets` alone (a loss
// function without parameters); the blocks' parameters are consecutive in
// named_parameters() order and cover them all. A called submodule whose forward is itself
// such a chain with nothing after it (an nn.Sequential) is split into its calls. Under
// stage 3 the adapter then runs the blocks itself, one by one, the same calls on the same
// tensors: each is gathered just before it runs and released after; in backward it is
// gathered again when the gradient of its output arrives and released once its parameters'
// gradients are accumulated. Any other model is one group, gathered around the whole
// forward and backward.
//
// A C++ torch::nn::Module with a loss function is the other source (ds/torch/torch_frontend.h,
// which includes libtorch's headers): the same contract, the loss function in forward's place.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ds/core/module.h"

namespace ds::torch {

struct FrontendAccess;  // builds a TorchModule over a C++ module (torch_frontend.cpp)

class TorchModule final : public Module {
 public:
  // Loads and checks `path` (see the contract above); throws ds::Error naming it.
  explicit TorchModule(const std::string& path);
  ~TorchModule() override;
  TorchModule(const TorchModule&) = delete;
  TorchModule& operator=(const TorchModule&) = delete;

  std::vector<ParamInfo> parameters() const override;
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  bool init_parameter_range(std::size_t first, std::span<const std::span<float>> params,
                            std::uint64_t seed) override;  // the module's values: always true
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;
  // A model given as a sequence of blocks: one group per block (see "ZeRO stage 3" above).
  std::vector<ParamGroup> parameter_groups() const override;
  void set_group_hooks(GroupHooks* hooks) override;

  // The model file, or "C++ module NAME" for a torch::nn::Module: what errors name.
  const std::string& path() const;

 private:
  struct Impl;
  friend struct FrontendAccess;
  explicit TorchModule(std::unique_ptr<Impl> impl);  // impl holds the source; takes its parameters
  std::unique_ptr<Impl> impl_;
};

// "1.13.0": the libtorch this library was compiled against.
std::string libtorch_version();

}  // namespace ds::torch
