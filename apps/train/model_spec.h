// Which built-in model to train and its shape: defaults, then the config's "model" section,
// then the command-line flags (the last one given wins).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "ds/nn/model_spec.h"
#include "options.h"

namespace ds::train {

using nn::ModelSpec;  // ds/nn/model_spec.h: the shape make_model builds

// `model_section` is the config's top-level "model" object (or null when absent); `source`
// names the config file in errors. Throws ds::Error naming the key for unknown keys and bad
// values (and the flag for bad --rope_theta / --rms_norm_eps), for shapes the model cannot take
// (n_embd not divisible by n_head; for llama an odd head dim or n_head not divisible by
// n_kv_head), and for llama settings given to another model.
ModelSpec resolve_model_spec(const nlohmann::json& model_section, const TrainOptions& opts,
                             const std::string& source);

}  // namespace ds::train
