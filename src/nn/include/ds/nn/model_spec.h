// The shape of a built-in model: which one (gpt | mlp | llama) and its sizes. The train app
// fills it from defaults, the config's "model" section and flags; make_model
// (ds/nn/model_factory.h) builds the model it names.
#pragma once

#include <cstdint>
#include <string>

namespace ds::nn {

struct ModelSpec {
  std::string type = "gpt";       // gpt | mlp | llama | torchscript:PATH (train --model)
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_kv_head = 0;          // llama: key/value heads (0: n_head)
  std::int64_t intermediate_size = 0;  // llama: SwiGLU width (0: llama_default_intermediate)
  double rope_theta = 10000.0;         // llama: rotary embedding base
  double rms_norm_eps = 1e-5;          // llama: RMSNorm epsilon
  bool tie_embeddings = false;         // llama: the LM head reuses the token embedding
  std::int64_t n_embd = 128;
  std::int64_t block_size = 64;
  std::int64_t vocab_size = 0;  // 0: from the data (256 for text, the token file's vocab; mlp on arrays: classes)
  // mlp on feature arrays: features per sample, read as they are. 0: the one-hot encoding of
  // block_size tokens (block_size x vocab_size features, the class the next token).
  std::int64_t in_features = 0;

  // One line naming the shape; the llama settings above appear only when not at their
  // defaults, so the line (which a resume compares) reads as before for default models.
  std::string describe() const;
};

}  // namespace ds::nn
