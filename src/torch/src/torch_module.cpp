// TorchModule: parameters and gradients as views of the engine's storage, forward through the
// module's forward and loss, backward through autograd with a readiness hook per parameter.
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cstring>

#include "ds/core/cpu_features.h"
#include "torch_call.h"
#include "torch_impl.h"

namespace ds::torch {

namespace {

at::ScalarType torch_dtype(DType t, const std::string& path) {
  switch (t) {
    case DType::F32: return at::kFloat;
    case DType::BF16: return at::kBFloat16;
    case DType::F16: return at::kHalf;
    default: DS_THROW(path << ": the engine's working dtype " << dtype_name(t) << " is not one libtorch trains in");
  }
}

// Calls `ready` after autograd has accumulated the parameter's gradient (a post hook on the
// parameter's AccumulateGrad node: it runs once per backward, after the sum over all uses).
class ReadyHook final : public ::torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> ready) : ready_(std::move(ready)) {}
  ::torch::autograd::variable_list operator()(const ::torch::autograd::variable_list& outputs,
                                              const ::torch::autograd::variable_list& /*inputs*/) override {
    ready_();
    return outputs;
  }

 private:
  std::function<void()> ready_;
};

at::Tensor view_of(const TensorView& v, const ParamInfo& info, at::ScalarType dtype, const char* what,
                   const std::string& path) {
  DS_CHECK(v.count == info.numel(), path << ": bind: " << what << " of " << info.name << " has " << v.count
                                         << " elements, the parameter " << info.numel());
  return at::from_blob(v.data, info.shape, at::TensorOptions().dtype(dtype));
}

}  // namespace

TorchModule::TorchModule(const std::string& path) : impl_(std::make_unique<Impl>()) {
  impl_->path = path;
  impl_->source = load_script(path);
  impl_->take_parameters();
}

TorchModule::TorchModule(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { impl_->take_parameters(); }

void TorchModule::Impl::take_parameters() {
  for (auto& [name, value] : DS_TORCH_CALL(path, source->named_parameters())) {
    names.push_back(name);
    infos.push_back({name, value.sizes().vec()});
    params.push_back(std::move(value));
  }
  DS_CHECK(!params.empty(), path << ": the module has no parameters to train");
  working = params.front().scalar_type();
  DS_CHECK(working == at::kFloat, path << ": the module's parameters must be fp32 (they are " << working
                                       << "); the ds_config's bf16 / fp16 sections cast it");
  take_groups();
}

TorchModule::~TorchModule() = default;

const std::string& TorchModule::path() const { return impl_->path; }

std::vector<ParamInfo> TorchModule::parameters() const { return impl_->infos; }

void TorchModule::init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) {
  Impl& m = *impl_;
  DS_CHECK(params.size() == m.params.size(), m.path << ": init_parameters got " << params.size()
                                                    << " parameters, the module has " << m.params.size());
  init_parameter_range(0, params, seed);
}

// The module's own values, so any range can be copied on its own (stage 3 then initialises
// a group at a time, and rank 0 never holds a second whole copy).
bool TorchModule::init_parameter_range(std::size_t first, std::span<const std::span<float>> params,
                                       std::uint64_t /*seed*/) {
  Impl& m = *impl_;
  DS_CHECK(first + params.size() <= m.params.size(), m.path << ": init_parameter_range(" << first << ") got "
                                                            << params.size() << " parameters, the module has "
                                                            << m.params.size());
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::size_t i = first + k;
    const at::Tensor values = DS_TORCH_CALL(m.path, m.params[i].detach().to(at::kFloat).contiguous());
    DS_CHECK(params[k].size() == std::size_t(values.numel()), m.path << ": init_parameters: " << m.names[i]
                                                                     << " has " << values.numel() << " elements");
    std::memcpy(params[k].data(), values.data_ptr<float>(), params[k].size_bytes());
  }
  return true;
}

// The module cast to the working dtype, then each parameter's data and .grad made views of
// the engine's storage, and a readiness hook on each gradient accumulator. set_data() keeps
// the parameter's identity (the module holds the same tensor), so no copy is left.
void TorchModule::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  Impl& m = *impl_;
  DS_CHECK(params.size() == m.params.size() && grads.size() == m.params.size(),
           m.path << ": bind got " << params.size() << " parameters and " << grads.size()
                  << " gradients, the module has " << m.params.size());
  const at::ScalarType dtype = torch_dtype(params.front().dtype, m.path);
  ::torch::NoGradGuard no_grad;
  if (dtype != m.working) {
    m.source->to(dtype);
    m.working = dtype;
  }
  m.param_ptrs.resize(m.params.size());
  m.grad_ptrs.resize(m.params.size());
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    at::Tensor& p = m.params[i];
    DS_TORCH_CALL(m.path, p.set_data(view_of(params[i], m.infos[i], dtype, "the parameter view", m.path)));
    DS_TORCH_CALL(m.path, p.mutable_grad() = view_of(grads[i], m.infos[i], dtype, "the gradient view", m.path));
    m.param_ptrs[i] = params[i].data;
    m.grad_ptrs[i] = grads[i].data;
  }
  // A rebind in the same dtype finds the same accumulators: the last bind's hooks go first.
  for (std::size_t i = 0; i < m.accumulators.size(); ++i)
    if (m.accumulators[i]) m.accumulators[i]->del_post_hook(m.hook_keys[i]);
  m.accumulators.assign(m.params.size(), nullptr);
  m.hook_keys.assign(m.params.size(), 0);
  m.reported.assign(m.params.size(), 0);
  for (std::size_t i = 0; i < m.params.size(); ++i) {
    if (!m.params[i].requires_grad()) continue;  // frozen: reported at the end of every backward
    m.accumulators[i] = DS_TORCH_CALL(m.path, ::torch::autograd::impl::grad_accumulator(m.params[i]));
    m.hook_keys[i] = m.accumulators[i]->add_post_hook(std::make_unique<ReadyHook>([&m, i] { m.ready(i); }));
  }
  at::set_num_threads(std::max(1, cpu_threads()));
}

// The module must leave the engine's memory in place: a replaced .grad (create_graph, or
// .grad set to None or assigned) or parameter data (set_, .data =) would train on copies.
void TorchModule::Impl::check_still_bound() const {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    const char* what = !g.defined() || g.data_ptr() != grad_ptrs[i] ? ".grad"
                       : params[i].data_ptr() != param_ptrs[i] ? "'s data" : nullptr;
    DS_CHECK(!what, path << ": after backward, " << names[i] << what
                           << " is no longer the engine's memory: the module replaced it (create_graph, "
                              "set_to_none, set_ or an assignment to .grad / .data) and would train on a copy");
  }
}

float TorchModule::forward(const Batch& batch) {
  Impl& m = *impl_;
  m.set_training(true);
  ::torch::AutoGradMode grad_mode(true);
  m.loss = m.forward_loss(batch, /*need_grad=*/true);
  return DS_TORCH_CALL(m.path, m.loss.detach().to(at::kFloat).item<float>());
}

float TorchModule::evaluate(const Batch& batch) {
  Impl& m = *impl_;
  m.set_training(false);
  ::torch::NoGradGuard no_grad;
  const at::Tensor loss = m.forward_loss(batch, /*need_grad=*/false);
  return DS_TORCH_CALL(m.path, loss.to(at::kFloat).item<float>());
}

// Autograd on loss * scale (the seed gradient is `scale`): the accumulators add into the
// engine's gradient views in place and the hooks report each parameter as it is done; the
// parameters no path reached are reported after, so every rank reports every parameter.
void TorchModule::backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
  Impl& m = *impl_;
  DS_CHECK(m.loss.defined(), m.path << ": backward without a forward before it");
  DS_CHECK(!m.grad_ptrs.empty(), m.path << ": backward before bind()");
  std::fill(m.reported.begin(), m.reported.end(), 0);
  m.begin_backward_groups();
  m.grad_ready = &grad_ready;
  const at::Tensor loss = std::move(m.loss);
  m.loss = at::Tensor();
  try {
    DS_TORCH_CALL(m.path, loss.backward(at::full({}, double(scale), loss.options())));
  } catch (...) {
    m.grad_ready = nullptr;
    m.end_backward_groups();
    throw;
  }
  m.grad_ready = nullptr;
  m.end_backward_groups();  // the blocks whose parameters got no gradient: nothing accumulates there
  for (std::size_t i = 0; i < m.params.size(); ++i)
    if (!m.reported[i]) grad_ready(i);
  m.check_still_bound();
}

}  // namespace ds::torch
