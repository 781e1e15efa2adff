#include "ds/nn/llama_layout.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::nn {

std::int64_t llama_default_intermediate(std::int64_t n_embd) {
  std::int64_t multiple_of = 1;
  while (multiple_of * 2 <= std::min<std::int64_t>(256, n_embd / 16)) multiple_of *= 2;
  const std::int64_t hidden = 2 * (4 * n_embd) / 3;  // int(2 * 4C / 3), as Llama's reference code
  return (hidden + multiple_of - 1) / multiple_of * multiple_of;
}

void validate(const LlamaConfig& c) {
  DS_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_kv_head > 0 && c.n_embd > 0 && c.block_size > 0 &&
               c.vocab_size > 0 && c.intermediate_size >= 0,
           "LlamaConfig: n_layer, n_head, n_kv_head, n_embd, block_size and vocab_size must be > 0 and "
           "intermediate_size >= 0 (got "
               << c.n_layer << ", " << c.n_head << ", " << c.n_kv_head << ", " << c.n_embd << ", "
               << c.block_size << ", " << c.vocab_size << ", " << c.intermediate_size << ")");
  DS_CHECK(c.n_embd % c.n_head == 0,
           "LlamaConfig: n_embd (" << c.n_embd << ") must be divisible by n_head (" << c.n_head << ")");
  DS_CHECK((c.n_embd / c.n_head) % 2 == 0, "LlamaConfig: the head dim n_embd / n_head ("
                                               << c.n_embd / c.n_head << ") must be even (rotary embedding)");
  DS_CHECK(c.n_head % c.n_kv_head == 0,
           "LlamaConfig: n_head (" << c.n_head << ") must be divisible by n_kv_head (" << c.n_kv_head << ")");
  DS_CHECK(c.rope_theta > 0 && c.rms_norm_eps > 0,
           "LlamaConfig: rope_theta (" << c.rope_theta << ") and rms_norm_eps (" << c.rms_norm_eps
                                       << ") must be > 0");
}

LlamaConfig resolved(const LlamaConfig& cfg) {
  LlamaConfig c = cfg;
  if (c.intermediate_size == 0) c.intermediate_size = llama_default_intermediate(c.n_embd);
  return c;
}

std::vector<LlamaParam> llama_parameters(const LlamaConfig& cfg) {
  validate(cfg);
  const LlamaConfig c = resolved(cfg);
  const std::int64_t C = c.n_embd, hd = C / c.n_head, KV = c.n_kv_head * hd, I = c.intermediate_size;
  std::vector<LlamaParam> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, C}, LlamaRole::Embedding, -1});
  for (std::int64_t l = 0; l < c.n_layer; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "self_attn.q_proj.weight", {c.n_head * hd, C}, LlamaRole::QProj, l});
    out.push_back({p + "self_attn.k_proj.weight", {KV, C}, LlamaRole::KProj, l});
    out.push_back({p + "self_attn.v_proj.weight", {KV, C}, LlamaRole::VProj, l});
    out.push_back({p + "self_attn.o_proj.weight", {C, c.n_head * hd}, LlamaRole::OProj, l});
    out.push_back({p + "mlp.gate_proj.weight", {I, C}, LlamaRole::GateProj, l});
    out.push_back({p + "mlp.up_proj.weight", {I, C}, LlamaRole::UpProj, l});
    out.push_back({p + "mlp.down_proj.weight", {C, I}, LlamaRole::DownProj, l});
    out.push_back({p + "input_layernorm.weight", {C}, LlamaRole::InputNorm, l});
    out.push_back({p + "post_attention_layernorm.weight", {C}, LlamaRole::PostAttnNorm, l});
  }
  out.push_back({"model.norm.weight", {C}, LlamaRole::FinalNorm, -1});
  if (!c.tie_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, C}, LlamaRole::LmHead, -1});
  return out;
}

LlamaIndex llama_index(const LlamaConfig& cfg, const std::vector<LlamaParam>& layout) {
  LlamaIndex x;
  x.layers.assign(std::size_t(cfg.n_layer), LlamaIndex::Layer{});
  for (std::size_t id = 0; id < layout.size(); ++id) {
    const LlamaParam& p = layout[id];
    LlamaIndex::Layer* L = p.layer >= 0 ? &x.layers.at(std::size_t(p.layer)) : nullptr;
    switch (p.role) {
      case LlamaRole::Embedding: x.embed = id; break;
      case LlamaRole::FinalNorm: x.normf = id; break;
      case LlamaRole::LmHead: x.head = id; break;
      case LlamaRole::QProj: L->q = id; break;
      case LlamaRole::KProj: L->k = id; break;
      case LlamaRole::VProj: L->v = id; break;
      case LlamaRole::OProj: L->o = id; break;
      case LlamaRole::GateProj: L->gate = id; break;
      case LlamaRole::UpProj: L->up = id; break;
      case LlamaRole::DownProj: L->down = id; break;
      case LlamaRole::InputNorm: L->ln1 = id; break;
      case LlamaRole::PostAttnNorm: L->ln2 = id; break;
    }
  }
  if (cfg.tie_embeddings) x.head = x.embed;
  return x;
}

}  // namespace ds::nn
