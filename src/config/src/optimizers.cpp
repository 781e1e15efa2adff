// The optimizer descriptors (ds/config/registry.h): DeepSpeed's names, torch's defaults, and
// what dstrain's engine restricts. Adding an optimizer: one entry here, its class in src/optim
// and its state tensors in ds/optim/params.h (docs/user/optimizers.md).
#include <algorithm>

#include <nlohmann/json.hpp>

#include "ds/config/registry.h"

// A Param entry names the members it sets; the others are value-initialized (no choices,
// no note). GCC warns about each omitted member of such a positional aggregate initializer.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace ds::config {

namespace {

using P = optim::OptimizerParams;
using Spec = Param<P>;

P defaults_for(const char* name) {
  P p;
  p.type = name;
  return p;
}

// Keys every optimizer has, first.
std::vector<Spec> common() {
  return {{"lr", &P::lr, Range::at_least(0)}, {"weight_decay", &P::weight_decay, Range::at_least(0)}};
}
std::vector<Spec> with(std::vector<Spec> more) {
  std::vector<Spec> all = common();
  all.insert(all.end(), more.begin(), more.end());
  return all;
}

const FalseOnly kAmsgrad{"amsgrad", "amsgrad is not supported (DeepSpeed's FusedAdam rejects it too); remove it"};
const FalseOnly kMaximize{"maximize", "maximize is not supported; remove it"};

OptimizerDescriptor adam(const char* name, const char* display) {
  OptimizerDescriptor d;
  d.name = name;
  d.display = display;
  d.defaults = defaults_for(name);
  Spec adam_w_mode{"adam_w_mode", &P::adam_w_mode};
  if (d.name == "adamw") {
    adam_w_mode.fixed_note = "optimizer.params.adam_w_mode false has no effect with type AdamW "
                             "(DeepSpeed applies decoupled weight decay for AdamW regardless)";
  }
  d.params = with({{"betas", &P::betas}, {"eps", &P::eps, Range::at_least(0)},
                   {"bias_correction", &P::bias_correction}, adam_w_mode});
  d.false_only = {kAmsgrad};
  d.noted = {{"torch_adam", "is accepted and ignored: dstrain has one Adam implementation per device"}};
  return d;
}

OptimizerDescriptor lamb() {
  OptimizerDescriptor d;
  d.name = "lamb";
  d.display = "Lamb";
  d.defaults = defaults_for("lamb");
  d.params = with({{"betas", &P::betas}, {"eps", &P::eps, Range::at_least(0)},
                   {"bias_correction", &P::bias_correction}, {"eps_inside_sqrt", &P::eps_inside_sqrt},
                   {"max_coeff", &P::max_coeff, Range::above(0)}, {"min_coeff", &P::min_coeff, Range::at_least(0)}});
  d.false_only = {kAmsgrad};
  d.needs_dynamic_loss_scale = "DeepSpeed's FusedLamb";
  d.zero_reason = "computes per-tensor trust ratios";
  d.check = [](const P& p) -> std::optional<std::pair<std::string, std::string>> {
    if (p.min_coeff > p.max_coeff) return {{"min_coeff", "must be <= max_coeff (" + nlohmann::json(p.max_coeff).dump() + ")"}};
    return std::nullopt;
  };
  return d;
}

OptimizerDescriptor sgd() {
  OptimizerDescriptor d;
  d.name = "sgd";
  d.display = "SGD";
  d.torch_name = true;
  d.defaults = defaults_for("sgd");
  d.params = with({{"momentum", &P::momentum, Range::at_least(0)}, {"dampening", &P::dampening, Range::any()},
                   {"nesterov", &P::nesterov}});
  d.false_only = {kMaximize};
  d.ignored = {"foreach", "differentiable", "fused"};
  d.check = [](const P& p) -> std::optional<std::pair<std::string, std::string>> {
    if (p.nesterov && (p.momentum <= 0 || p.dampening != 0))
      return {{"nesterov", "Nesterov momentum requires a momentum > 0 and zero dampening (as torch.optim.SGD)"}};
    return std::nullopt;
  };
  return d;
}

OptimizerDescriptor adagrad() {
  OptimizerDescriptor d;
  d.name = "adagrad";
  d.display = "Adagrad";
  d.defaults = defaults_for("adagrad");
  d.defaults.lr = 1e-2;  // torch.optim.Adagrad's defaults
  d.defaults.eps = 1e-10;
  d.params = with({{"eps", &P::eps, Range::at_least(0)}, {"lr_decay", &P::lr_decay, Range::at_least(0)},
                   {"initial_accumulator_value", &P::initial_accumulator_value, Range::at_least(0)}});
  d.false_only = {kMaximize};
  d.ignored = {"foreach", "differentiable", "fused"};
  return d;
}

}  // namespace

const std::vector<OptimizerDescriptor>& optimizer_registry() {
  static const std::vector<OptimizerDescriptor> all = {adam("adam", "Adam"), adam("adamw", "AdamW"), sgd(), lamb(),
                                                       adagrad()};
  return all;
}

const OptimizerDescriptor* find_optimizer(const std::string& name) {
  for (const auto& d : optimizer_registry())
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace ds::config
