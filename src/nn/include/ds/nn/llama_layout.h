// The Llama-style decoder's shape and parameter layout, apart from any implementation: the CPU
// model (ds/nn/llama.h), a future GPU one and weight loading/saving all take the parameter list
// from llama_parameters() so names, shapes and order agree everywhere.
//
// Names and layouts are those of Hugging Face's LlamaForCausalLM state dict (PyTorch Linear:
// weight[out, in]), so its weights load by name without any permutation: the rotary embedding
// follows HF's rotate_half convention (the two halves of each head, not interleaved pairs).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ds::nn {

struct LlamaConfig {
  std::int64_t n_layer = 4;
  std::int64_t n_head = 4;
  std::int64_t n_kv_head = 4;          // grouped-query attention: n_head % n_kv_head == 0
  std::int64_t n_embd = 128;           // hidden size; head dim = n_embd / n_head (even: rotary)
  std::int64_t intermediate_size = 0;  // SwiGLU width; 0: llama_default_intermediate(n_embd)
  std::int64_t block_size = 128;       // longest sequence (positions 0 .. block_size - 1)
  std::int64_t vocab_size = 256;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;  // true: no lm_head.weight, the head reuses model.embed_tokens.weight
};

// Llama's rule for the MLP width: 2/3 of 4 * n_embd, rounded up to a multiple of multiple_of.
// Llama uses multiple_of = 256 (n_embd 4096 -> 11008); that would make a tiny model's MLP many
// times wider than 8/3 n_embd (n_embd 64 -> 256), so multiple_of is scaled with the width:
// the largest power of two <= n_embd / 16, between 1 and 256 (n_embd 4096 -> 256 -> 11008 as
// Llama; n_embd 128 -> 8 -> 344; n_embd 32 -> 2 -> 86).
std::int64_t llama_default_intermediate(std::int64_t n_embd);

// Throws ds::Error naming the field when a config cannot be built: every size > 0, n_embd %
// n_head == 0, an even head dim, n_head % n_kv_head == 0, rope_theta > 0, rms_norm_eps > 0.
void validate(const LlamaConfig& cfg);
// cfg with intermediate_size resolved (0 -> the default rule).
LlamaConfig resolved(const LlamaConfig& cfg);

// What a parameter is, so loaders and other implementations need not parse names.
enum class LlamaRole {
  Embedding,      // model.embed_tokens.weight [V, C]
  InputNorm,      // model.layers.L.input_layernorm.weight [C]
  QProj,          // model.layers.L.self_attn.q_proj.weight [n_head * hd, C]
  KProj,          // model.layers.L.self_attn.k_proj.weight [n_kv_head * hd, C]
  VProj,          // model.layers.L.self_attn.v_proj.weight [n_kv_head * hd, C]
  OProj,          // model.layers.L.self_attn.o_proj.weight [C, n_head * hd]
  GateProj,       // model.layers.L.mlp.gate_proj.weight [I, C]
  UpProj,         // model.layers.L.mlp.up_proj.weight [I, C]
  DownProj,       // model.layers.L.mlp.down_proj.weight [C, I]
  PostAttnNorm,   // model.layers.L.post_attention_layernorm.weight [C]
  FinalNorm,      // model.norm.weight [C]
  LmHead,         // lm_head.weight [V, C] (absent when tie_embeddings)
};

struct LlamaParam {
  std::string name;
  std::vector<std::int64_t> shape;
  LlamaRole role;
  std::int64_t layer = -1;  // the decoder layer, -1 for the embedding, final norm and head
};

// All parameters in the order of LlamaForCausalLM.named_parameters(): the embedding, per layer
// q, k, v, o, gate, up, down, input_layernorm, post_attention_layernorm, then model.norm and
// (untied) lm_head. Validates cfg.
std::vector<LlamaParam> llama_parameters(const LlamaConfig& cfg);

// Where each parameter sits in a llama_parameters() list: the indices every implementation
// reads its weights and gradients by.
struct LlamaIndex {
  struct Layer { std::size_t q = 0, k = 0, v = 0, o = 0, gate = 0, up = 0, down = 0, ln1 = 0, ln2 = 0; };
  std::size_t embed = 0, normf = 0, head = 0;  // head == embed when tie_embeddings
  std::vector<Layer> layers;                   // n_layer entries
};
LlamaIndex llama_index(const LlamaConfig& cfg, const std::vector<LlamaParam>& layout);

// Init as HF's LlamaPreTrainedModel (initializer_range 0.02): every matrix N(0, 0.02), every
// RMSNorm weight 1.
inline constexpr float kLlamaInitStd = 0.02f;

}  // namespace ds::nn
