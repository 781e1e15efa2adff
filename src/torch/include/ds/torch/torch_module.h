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
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;

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
