// The built-in models' module trees for the flops profiler (ds/core/module_profile.h): the
// modules of Hugging Face's GPT2LMHeadModel / LlamaForCausalLM layout under the names our
// parameters carry, each module's parameters, and per forward the MACs of each module's own
// matrix products from the layer shapes. The MACs of one forward of B sequences of T tokens
// add up to B * T * flops_per_token(T) / 6 (the models' analytic count: training FLOPs are
// 3x the forward's, and a MAC is 2 FLOPs); elementwise ops count none.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "ds/core/module.h"
#include "ds/core/module_profile.h"
#include "ds/nn/llama_layout.h"

namespace ds::nn {

struct GptConfig;
struct MlpConfig;

// The tree's index of each module an op of one decoder block runs in.
struct BlockModules {
  int block = 0, norm_1 = 0, attn = 0, q = 0, k = 0, v = 0, attn_out = 0, norm_2 = 0, mlp = 0, up = 0, gate = 0,
      down = 0;
};

// A decoder's tree and where its ops go: `model` (the loss and anything outside the
// modules), the embedding tables, the blocks, the final norm, the head.
struct DecoderModules {
  ModuleProfile tree;
  int model = 0, embed = 0, final_norm = 0, head = 0;
  std::vector<BlockModules> blocks;
};

// GPT: wte, wpe, h.N (ln_1, attn: c_attn, c_proj; ln_2, mlp: c_fc, c_proj), ln_f, lm_head
// (tied to wte: its parameters are counted there). q is c_attn (q, k and v in one GEMM).
DecoderModules gpt_modules(const GptConfig& cfg, std::span<const ParamInfo> params);
void add_gpt_forward_macs(const GptConfig& cfg, const DecoderModules& m, std::int64_t B, std::int64_t T,
                          ModuleProfile& out);

// Llama: model (embed_tokens, layers.N (input_layernorm, self_attn: q/k/v/o_proj;
// post_attention_layernorm, mlp: gate/up/down_proj), norm), lm_head.
DecoderModules llama_modules(const LlamaConfig& cfg, std::span<const ParamInfo> params);
void add_llama_forward_macs(const LlamaConfig& cfg, const DecoderModules& m, std::int64_t B, std::int64_t T,
                            ModuleProfile& out);

// MLP: fc (fc.0, fc.1, ...), head; the GELUs and the loss run in the model.
struct MlpModules {
  ModuleProfile tree;
  int model = 0, head = 0;
  std::vector<int> fc;
};
MlpModules mlp_modules(const MlpConfig& cfg, std::span<const ParamInfo> params);
void add_mlp_forward_macs(const MlpConfig& cfg, const MlpModules& m, std::int64_t B, ModuleProfile& out);

}  // namespace ds::nn
