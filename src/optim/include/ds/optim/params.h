// The hyper-parameters of one optimizer, as plain data: what make_optimizer() takes. The
// config library fills it from ds_config.json (its descriptors, ds/config/registry.h, name
// each field's key, default and range); this library never reads a config.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace ds::optim {

struct OptimizerParams {
  // Canonical lower-case name: "adam", "adamw", "sgd", "lamb", "adagrad".
  std::string type = "adam";
  double lr = 1e-3;
  std::array<double, 2> betas{0.9, 0.999};
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adam_w_mode = true;  // Adam: decoupled decay unless adam_w_mode=false (AdamW: always)
  // SGD (torch defaults)
  double momentum = 0.0, dampening = 0.0;
  bool nesterov = false;
  // Lamb
  double max_coeff = 10.0, min_coeff = 0.01;
  bool eps_inside_sqrt = false;
  // Adagrad (torch defaults: lr 1e-2, eps 1e-10)
  double lr_decay = 0.0, initial_accumulator_value = 0.0;
};

// The state tensors an optimizer of these params keeps, one fp32 value per parameter each:
// their checkpoint names in the order its kernels take them (SGD keeps momentum_buffer only
// with momentum != 0; an unknown type keeps none). The one list: Optimizer::state_names(),
// the config's descriptors and the engine's memory estimate read it.
inline std::vector<std::string> optimizer_state_names(const OptimizerParams& p) {
  if (p.type == "adam" || p.type == "adamw" || p.type == "lamb") return {"exp_avg", "exp_avg_sq"};
  if (p.type == "sgd") return p.momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{};
  if (p.type == "adagrad") return {"sum"};
  return {};
}

}  // namespace ds::optim

namespace ds::config {
// DsConfig::optimizer's type (ds/config/ds_config.h): the same struct under the config's name.
using OptimizerConfig = optim::OptimizerParams;
}  // namespace ds::config
