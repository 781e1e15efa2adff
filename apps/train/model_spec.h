// Which built-in model to train and its shape: defaults, then the config's "model" section,
// then the command-line flags (the last one given wins).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "options.h"

namespace ds::train {

struct ModelSpec {
  std::string type = "gpt";       // gpt | mlp | llama
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_kv_head = 0;          // llama: key/value heads (0: n_head)
  std::int64_t intermediate_size = 0;  // llama: SwiGLU width (0: llama_default_intermediate)
  double rope_theta = 10000.0;         // llama: rotary embedding base
  double rms_norm_eps = 1e-5;          // llama: RMSNorm epsilon
  bool tie_embeddings = false;         // llama: the LM head reuses the token embedding
  std::int64_t n_embd = 128;
  std::int64_t block_size = 64;
  std::int64_t vocab_size = 0;  // 0: from the data (256 for text, the token file's vocab)

  // One line naming the shape; the llama settings above appear only when not at their
  // defaults, so the line (which a resume compares) reads as before for default models.
  std::string describe() const;
};

// `model_section` is the config's top-level "model" object (or null when absent); `source`
// names the config file in errors. Throws ds::Error naming the key for unknown keys and bad
// values (and the flag for bad --rope_theta / --rms_norm_eps), for shapes the model cannot take
// (n_embd not divisible by n_head; for llama an odd head dim or n_head not divisible by
// n_kv_head), and for llama settings given to another model.
ModelSpec resolve_model_spec(const nlohmann::json& model_section, const TrainOptions& opts,
                             const std::string& source);

}  // namespace ds::train
