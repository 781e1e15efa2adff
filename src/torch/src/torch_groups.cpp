// ZeRO stage 3 for a model given as a sequence of blocks (torch_blocks.h): the adapter runs
// the blocks itself and brackets each with the engine's GroupHooks. Forward: acquire just
// before the block runs, release after. Backward: a hook on the gradient of the block's
// output acquires its group just before the block's backward runs; the group is released
// when the last of its parameters has its gradient accumulated (the readiness hooks), or at
// the end of backward for a block whose parameters got no gradient. The parameter views
// stay where bind() put them: the engine gathers a group into the same flat-space addresses,
// so tensors autograd saved in forward read the gathered values again in backward.
#include <algorithm>

#include "ds/core/log.h"
#include "torch_blocks.h"
#include "torch_call.h"
#include "torch_impl.h"

namespace ds::torch {

void TorchModule::Impl::take_groups() {
  groups = source->parameter_groups();
  group_of.assign(params.size(), kNoGroup);
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t i = groups[g].first; i < groups[g].first + groups[g].count; ++i) group_of[i] = g;
  grads_pending.assign(groups.size(), 0);
  held.assign(groups.size(), 0);
}

at::Tensor TorchModule::Impl::source_loss(const at::Tensor& inputs, const at::Tensor& targets, bool need_grad) {
  if (!by_blocks()) return source->loss(inputs, targets);
  const BlockRan ran = [this](std::size_t g, const at::Tensor& output) { after_block(g, output); };
  return source->loss_by_blocks(inputs, targets, hooks, need_grad ? ran : BlockRan());
}

void TorchModule::Impl::after_block(std::size_t g, const at::Tensor& output) {
  if (!output.requires_grad()) return;  // no backward through this block
  DS_TORCH_CALL(path, output.register_hook([this, g](const at::Tensor& /*grad*/) {
    if (held[g]) return;
    hooks->acquire(g, Pass::Backward);
    held[g] = 1;
  }));
}

void TorchModule::Impl::begin_backward_groups() {
  if (!by_blocks()) return;
  std::fill(held.begin(), held.end(), 0);
  std::fill(grads_pending.begin(), grads_pending.end(), 0);
  for (std::size_t i = 0; i < params.size(); ++i)
    if (accumulators[i]) ++grads_pending[group_of[i]];  // frozen parameters never report
}

void TorchModule::Impl::group_reported(std::size_t i) {
  const std::size_t g = group_of[i];
  if (grads_pending[g] == 0 || --grads_pending[g] > 0 || !held[g]) return;
  held[g] = 0;
  hooks->release(g, Pass::Backward);
}

void TorchModule::Impl::end_backward_groups() noexcept {
  for (std::size_t g = 0; g < held.size(); ++g) {
    if (!held[g]) continue;
    held[g] = 0;
    if (hooks) hooks->release(g, Pass::Backward);
  }
}

std::vector<ParamGroup> TorchModule::parameter_groups() const { return impl_->groups; }

// Called by a stage-3 engine: say which way the model will be gathered, since the form is
// read off forward and a user cannot otherwise tell.
void TorchModule::set_group_hooks(GroupHooks* hooks) {
  Impl& m = *impl_;
  m.end_backward_groups();
  m.hooks = hooks;
  if (!hooks) return;
  if (m.groups.empty()) {
    DS_INFO(m.path << ": ZeRO stage 3 gathers the whole model around each forward and backward (forward is "
                      "not a sequence of blocks)");
  } else {
    DS_INFO(m.path << ": ZeRO stage 3 gathers one block at a time (" << m.groups.size() << " blocks: "
                   << m.groups.front().name << " ... " << m.groups.back().name << ")");
  }
}

}  // namespace ds::torch
