// A TorchScript model given as a sequence of blocks, found in its forward graph, so ZeRO
// stage 3 can gather one block's parameters at a time (ds/torch/torch_module.h, "Stage 3").
//
// The form: forward passes `inputs` through submodules one after the other, each call
// taking the previous call's output (and, if it likes, `targets`), then computes the result
// from the last output and `targets` alone (a loss function, no parameters). A called
// submodule whose own forward is such a chain without a result step (an nn.Sequential,
// whose scripted forward is one) is split into its calls. The adapter then runs the blocks
// itself, one by one, exactly as forward would: the same calls on the same tensors.
#pragma once

#include <torch/csrc/jit/api/function_impl.h>
#include <torch/script.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ds/core/module.h"

namespace ds::torch {

inline constexpr std::size_t kNoGroup = static_cast<std::size_t>(-1);

struct BlockCall {
  std::string path;  // "body.2": the submodule's path from the top module
  ::torch::jit::Module module;
  bool with_targets = false;     // forward(x, targets)
  std::size_t group = kNoGroup;  // its parameter group; kNoGroup: it has no parameters
};

struct BlockChain {
  std::vector<BlockCall> calls;  // in forward's order
  std::vector<ParamGroup> groups;  // one per call with parameters, tiling named_parameters()
  // The step from the last output (and targets, in the loss form) to forward's result; null
  // when forward returns the last output itself.
  std::shared_ptr<::torch::jit::GraphFunction> result;
};

// The chain of `root`'s forward, or nullopt where forward is not one (anything else: a skip
// connection, a parameter of the top module, a block called twice, blocks whose parameters
// are not consecutive in named_parameters() order). `param_names`: named_parameters() order.
std::optional<BlockChain> find_block_chain(const ::torch::jit::Module& root, bool loss_form,
                                           const std::vector<std::string>& param_names);

// Called after block `group` ran, with its output (the adapter hooks its gradient there).
using BlockRan = std::function<void(std::size_t group, const at::Tensor& output)>;

// forward's result through the chain: each block with parameters bracketed by `hooks`
// (Pass::Forward; null: no brackets), then `ran`. `targets` is undefined in the logits form.
at::Tensor run_block_chain(const BlockChain& chain, const at::Tensor& inputs, const at::Tensor& targets,
                           GroupHooks* hooks, const BlockRan& ran);

}  // namespace ds::torch
