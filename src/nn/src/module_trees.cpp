// The built-in models' module trees and forward MACs (ds/nn/module_trees.h).
#include "ds/nn/module_trees.h"

#include <map>
#include <string>

#include "ds/core/error.h"
#include "ds/nn/gpt.h"
#include "ds/nn/mlp.h"

namespace ds::nn {

namespace {

// Builds a tree by path: each module's parent is the module added under the path's prefix.
class TreeBuilder {
 public:
  explicit TreeBuilder(ModuleProfile& tree) : tree_(tree) {}
  int root(const char* type) { return add_at("", type, -1); }
  // `name` under `parent` ("attn" under "h.0" is "h.0.attn").
  int add(int parent, const std::string& name, const char* type) {
    const std::string& p = tree_.modules()[std::size_t(parent)].name;
    return add_at(p.empty() ? name : p + "." + name, type, parent);
  }
  // Each parameter to the module of the longest prefix of its name ("h.0.ln_1.weight" to
  // "h.0.ln_1"; the model when none).
  void assign(std::span<const ParamInfo> params) {
    std::vector<std::int64_t> own(tree_.modules().size(), 0);
    for (const ParamInfo& p : params) {
      std::string path = p.name;
      int at = 0;
      for (std::size_t dot = path.rfind('.'); dot != std::string::npos; dot = path.rfind('.')) {
        path.resize(dot);
        if (auto it = index_.find(path); it != index_.end()) {
          at = it->second;
          break;
        }
      }
      own[std::size_t(at)] += std::int64_t(p.numel());
    }
    ModuleProfile rebuilt;
    for (std::size_t i = 0; i < own.size(); ++i) {
      const ModuleStats& m = tree_.modules()[i];
      rebuilt.add(m.name, m.type, m.parent, own[i]);
    }
    tree_ = std::move(rebuilt);
  }

 private:
  int add_at(const std::string& path, const char* type, int parent) {
    const int i = tree_.add(path, type, parent);
    index_[path] = i;
    return i;
  }
  ModuleProfile& tree_;
  std::map<std::string, int> index_;
};

// A decoder's widths: model C, keys and values KV, MLP I, vocabulary V; gated: SwiGLU's
// gate projection beside the up projection.
struct DecoderShape {
  double C, KV, I, V;
  bool gated;
};

// Per block: q, k, v, the score products (Q K^T and P V over the heads, 2 x B*T*T*C), the
// output projection, the MLP; then the head. The GPT's c_attn is q, k and v at once.
void add_decoder_macs(const DecoderModules& m, const DecoderShape& s, std::int64_t B, std::int64_t T,
                      ModuleProfile& out) {
  const double N = double(B) * double(T);
  for (const BlockModules& k : m.blocks) {
    out.add_macs(k.q, N * s.C * s.C);
    out.add_macs(k.k, N * s.C * s.KV);
    out.add_macs(k.v, N * s.C * s.KV);
    out.add_macs(k.attn, 2 * double(B) * double(T) * double(T) * s.C);
    out.add_macs(k.attn_out, N * s.C * s.C);
    if (s.gated) out.add_macs(k.gate, N * s.C * s.I);
    out.add_macs(k.up, N * s.C * s.I);
    out.add_macs(k.down, N * s.I * s.C);
  }
  out.add_macs(m.head, N * s.C * s.V);
}

}  // namespace

DecoderModules gpt_modules(const GptConfig& cfg, std::span<const ParamInfo> params) {
  DecoderModules m;
  TreeBuilder b(m.tree);
  m.model = b.root("Gpt");
  m.embed = b.add(m.model, "wte", "Embedding");
  b.add(m.model, "wpe", "Embedding");
  const int h = b.add(m.model, "h", "ModuleList");
  for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
    BlockModules k;
    k.block = b.add(h, std::to_string(l), "Block");
    k.norm_1 = b.add(k.block, "ln_1", "LayerNorm");
    k.attn = b.add(k.block, "attn", "Attention");
    k.q = k.k = k.v = b.add(k.attn, "c_attn", "Linear");
    k.attn_out = b.add(k.attn, "c_proj", "Linear");
    k.norm_2 = b.add(k.block, "ln_2", "LayerNorm");
    k.mlp = b.add(k.block, "mlp", "Mlp");
    k.up = k.gate = b.add(k.mlp, "c_fc", "Linear");
    k.down = b.add(k.mlp, "c_proj", "Linear");
    m.blocks.push_back(k);
  }
  m.final_norm = b.add(m.model, "ln_f", "LayerNorm");
  m.head = b.add(m.model, "lm_head", "Linear");
  b.assign(params);
  return m;
}

void add_gpt_forward_macs(const GptConfig& cfg, const DecoderModules& m, std::int64_t B, std::int64_t T,
                          ModuleProfile& out) {
  const double C = double(cfg.n_embd);
  add_decoder_macs(m, {C, C, 4 * C, double(cfg.vocab_size), false}, B, T, out);
}

DecoderModules llama_modules(const LlamaConfig& cfg, std::span<const ParamInfo> params) {
  DecoderModules m;
  TreeBuilder b(m.tree);
  m.model = b.root("LlamaForCausalLM");
  const int inner = b.add(m.model, "model", "LlamaModel");
  m.embed = b.add(inner, "embed_tokens", "Embedding");
  const int layers = b.add(inner, "layers", "ModuleList");
  for (std::int64_t l = 0; l < cfg.n_layer; ++l) {
    BlockModules k;
    k.block = b.add(layers, std::to_string(l), "LlamaDecoderLayer");
    k.norm_1 = b.add(k.block, "input_layernorm", "RMSNorm");
    k.attn = b.add(k.block, "self_attn", "LlamaAttention");
    k.q = b.add(k.attn, "q_proj", "Linear");
    k.k = b.add(k.attn, "k_proj", "Linear");
    k.v = b.add(k.attn, "v_proj", "Linear");
    k.attn_out = b.add(k.attn, "o_proj", "Linear");
    k.norm_2 = b.add(k.block, "post_attention_layernorm", "RMSNorm");
    k.mlp = b.add(k.block, "mlp", "LlamaMLP");
    k.gate = b.add(k.mlp, "gate_proj", "Linear");
    k.up = b.add(k.mlp, "up_proj", "Linear");
    k.down = b.add(k.mlp, "down_proj", "Linear");
    m.blocks.push_back(k);
  }
  m.final_norm = b.add(inner, "norm", "RMSNorm");
  m.head = b.add(m.model, "lm_head", "Linear");
  b.assign(params);
  return m;
}

void add_llama_forward_macs(const LlamaConfig& cfg, const DecoderModules& m, std::int64_t B, std::int64_t T,
                            ModuleProfile& out) {
  DS_CHECK(cfg.intermediate_size > 0, "add_llama_forward_macs: the config's intermediate_size is not resolved");
  const double KV = double(cfg.n_kv_head) * double(cfg.n_embd / cfg.n_head);
  add_decoder_macs(m, {double(cfg.n_embd), KV, double(cfg.intermediate_size), double(cfg.vocab_size), true}, B, T,
                   out);
}

MlpModules mlp_modules(const MlpConfig& cfg, std::span<const ParamInfo> params) {
  MlpModules m;
  TreeBuilder b(m.tree);
  m.model = b.root("Mlp");
  if (cfg.n_hidden_layers > 0) {
    const int fc = b.add(m.model, "fc", "ModuleList");
    for (std::int64_t i = 0; i < cfg.n_hidden_layers; ++i) m.fc.push_back(b.add(fc, std::to_string(i), "Linear"));
  }
  m.head = b.add(m.model, "head", "Linear");
  b.assign(params);
  return m;
}

void add_mlp_forward_macs(const MlpConfig& cfg, const MlpModules& m, std::int64_t B, ModuleProfile& out) {
  double in = double(cfg.in_features);
  for (int fc : m.fc) {
    out.add_macs(fc, double(B) * in * double(cfg.hidden));
    in = double(cfg.hidden);
  }
  out.add_macs(m.head, double(B) * in * double(cfg.n_classes));
}

}  // namespace ds::nn
