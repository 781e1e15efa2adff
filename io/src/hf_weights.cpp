// Hugging Face name tables and loading a safetensors file into a parameter list.
#include "ds/io/hf_weights.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "ds/core/error.h"
#include "ds/core/excerpt.h"

namespace ds::io::hf {

namespace {

// GPT-2 (transformers' GPT2Model / GPT2LMHeadModel).
constexpr Rule kGpt2Rules[] = {
    {"wte.weight", "wte.weight", false, false},
    {"wpe.weight", "wpe.weight", false, true},  // n_positions may exceed our block_size
    {"h.{l}.ln_1.weight", "h.{l}.ln_1.weight", false, false},
    {"h.{l}.ln_1.bias", "h.{l}.ln_1.bias", false, false},
    {"h.{l}.attn.c_attn.weight", "h.{l}.attn.c_attn.weight", true, false},
    {"h.{l}.attn.c_attn.bias", "h.{l}.attn.c_attn.bias", false, false},
    {"h.{l}.attn.c_proj.weight", "h.{l}.attn.c_proj.weight", true, false},
    {"h.{l}.attn.c_proj.bias", "h.{l}.attn.c_proj.bias", false, false},
    {"h.{l}.ln_2.weight", "h.{l}.ln_2.weight", false, false},
    {"h.{l}.ln_2.bias", "h.{l}.ln_2.bias", false, false},
    {"h.{l}.mlp.c_fc.weight", "h.{l}.mlp.c_fc.weight", true, false},
    {"h.{l}.mlp.c_fc.bias", "h.{l}.mlp.c_fc.bias", false, false},
    {"h.{l}.mlp.c_proj.weight", "h.{l}.mlp.c_proj.weight", true, false},
    {"h.{l}.mlp.c_proj.bias", "h.{l}.mlp.c_proj.bias", false, false},
    {"ln_f.weight", "ln_f.weight", false, false},
    {"ln_f.bias", "ln_f.bias", false, false},
};
constexpr std::string_view kGpt2Prefixes[] = {"transformer."};
constexpr std::string_view kGpt2Ignored[] = {"h.{l}.attn.bias", "h.{l}.attn.masked_bias"};
constexpr Tied kGpt2Tied[] = {{"lm_head.weight", "wte.weight"}};
const Architecture kGpt2{"gpt2", kGpt2Rules, kGpt2Prefixes, kGpt2Ignored, kGpt2Tied};

// Llama (transformers' LlamaForCausalLM): ds::nn::Llama already uses its names and Linear
// layouts, so every rule is the identity; older transformers saved the rotary inv_freq buffer,
// and a tied model's file may still carry lm_head.weight.
constexpr Rule kLlamaRules[] = {
    {"model.embed_tokens.weight", "model.embed_tokens.weight", false, false},
    {"model.layers.{l}.self_attn.q_proj.weight", "model.layers.{l}.self_attn.q_proj.weight", false, false},
    {"model.layers.{l}.self_attn.k_proj.weight", "model.layers.{l}.self_attn.k_proj.weight", false, false},
    {"model.layers.{l}.self_attn.v_proj.weight", "model.layers.{l}.self_attn.v_proj.weight", false, false},
    {"model.layers.{l}.self_attn.o_proj.weight", "model.layers.{l}.self_attn.o_proj.weight", false, false},
    {"model.layers.{l}.mlp.gate_proj.weight", "model.layers.{l}.mlp.gate_proj.weight", false, false},
    {"model.layers.{l}.mlp.up_proj.weight", "model.layers.{l}.mlp.up_proj.weight", false, false},
    {"model.layers.{l}.mlp.down_proj.weight", "model.layers.{l}.mlp.down_proj.weight", false, false},
    {"model.layers.{l}.input_layernorm.weight", "model.layers.{l}.input_layernorm.weight", false, false},
    {"model.layers.{l}.post_attention_layernorm.weight", "model.layers.{l}.post_attention_layernorm.weight", false, false},
    {"model.norm.weight", "model.norm.weight", false, false},
    {"lm_head.weight", "lm_head.weight", false, false},
};
constexpr std::string_view kLlamaIgnored[] = {"model.layers.{l}.self_attn.rotary_emb.inv_freq"};
constexpr Tied kLlamaTied[] = {{"lm_head.weight", "model.embed_tokens.weight"}};
const Architecture kLlama{"llama", kLlamaRules, {}, kLlamaIgnored, kLlamaTied};

const Architecture* const kArchitectures[] = {&kGpt2, &kLlama};

// Whether `name` matches `pattern` ("{l}" = a layer index, digits without a leading zero);
// the index goes to *layer.
bool match(std::string_view pattern, std::string_view name, std::string* layer) {
  const auto at = pattern.find("{l}");
  if (at == std::string_view::npos) return pattern == name;
  const std::string_view pre = pattern.substr(0, at), post = pattern.substr(at + 3);
  if (name.size() <= pre.size() + post.size() || name.substr(0, pre.size()) != pre ||
      name.substr(name.size() - post.size()) != post)
    return false;
  const std::string_view mid = name.substr(pre.size(), name.size() - pre.size() - post.size());
  if (mid.size() > 1 && mid[0] == '0') return false;
  for (char c : mid)
    if (c < '0' || c > '9') return false;
  if (layer) *layer = std::string(mid);
  return true;
}

std::string substitute(std::string_view pattern, const std::string& layer) {
  std::string s(pattern);
  const auto at = s.find("{l}");
  if (at != std::string::npos) s.replace(at, 3, layer);
  return s;
}

const Rule* rule_for(const Architecture& arch, std::string_view ours, std::string* layer) {
  for (const Rule& r : arch.rules)
    if (match(r.ours, ours, layer)) return &r;
  return nullptr;
}

// Our shape as rows x cols (a 1-D tensor is one row).
std::pair<std::int64_t, std::int64_t> as_2d(const std::vector<std::int64_t>& shape) {
  if (shape.empty()) return {1, 1};
  std::int64_t rest = 1;
  for (std::size_t i = 1; i < shape.size(); ++i) rest *= shape[i];
  return {shape[0], rest};
}

// Files ds_to_fp32 wrote with dstrain's names and layout (not --hf_names).
bool dstrain_layout(const SafetensorsReader& file) {
  const auto& m = file.metadata();
  auto producer = m.find("producer");
  auto layout = m.find("layout");
  return producer != m.end() && producer->second.rfind("dstrain", 0) == 0 &&
         (layout == m.end() || layout->second == "dstrain");
}

}  // namespace

const Architecture& gpt2() { return kGpt2; }
const Architecture& llama() { return kLlama; }
std::span<const Architecture* const> architectures() { return kArchitectures; }

const Architecture* detect(std::span<const ParamInfo> params) {
  for (const Architecture* a : kArchitectures) {
    bool all = !params.empty();
    for (const auto& p : params) all = all && rule_for(*a, p.name, nullptr) != nullptr;
    if (all) return a;
  }
  return nullptr;
}

std::vector<HfTensor> to_hf(const Architecture& arch, std::span<const ParamInfo> params) {
  std::vector<HfTensor> out;
  for (const auto& p : params) {
    std::string layer;
    const Rule* r = rule_for(arch, p.name, &layer);
    DS_CHECK(r, "parameter '" << p.name << "' has no Hugging Face " << arch.name << " name");
    HfTensor t;
    t.name = substitute(r->hf, layer);
    t.shape = p.shape;
    t.transpose = r->transpose;
    if (r->transpose) {
      DS_CHECK(p.shape.size() == 2, "parameter '" << p.name << "' is transposed for Hugging Face but has shape "
                                                  << shape_text(p.shape) << ", not 2-D");
      std::swap(t.shape[0], t.shape[1]);
    }
    out.push_back(std::move(t));
  }
  return out;
}

void transpose(const float* in, float* out, std::int64_t rows, std::int64_t cols) {
  // Blocked, so both sides stay in cache for the large matrices.
  constexpr std::int64_t kB = 32;
  for (std::int64_t r0 = 0; r0 < rows; r0 += kB)
    for (std::int64_t c0 = 0; c0 < cols; c0 += kB)
      for (std::int64_t r = r0; r < std::min(rows, r0 + kB); ++r)
        for (std::int64_t c = c0; c < std::min(cols, c0 + kB); ++c) out[r * cols + c] = in[c * rows + r];
}

namespace {

using UsedTensors = std::map<const SafetensorsTensor*, bool>;
// File names without the architecture's optional prefix.
using BareNames = std::map<std::string, const SafetensorsTensor*, std::less<>>;

// A file with dstrain's names and layout: every tensor is a parameter, by name.
LoadPlan plan_dstrain(const SafetensorsReader& file, std::span<const ParamInfo> params, UsedTensors& used) {
  const std::string& path = file.path();
  LoadPlan plan;
  plan.sources.resize(params.size());
  plan.naming = "dstrain names";
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    const SafetensorsTensor* t = file.find(p.name);
    DS_CHECK(t, path << ": no tensor '" << p.name << "' (a dstrain export of another model?)");
    DS_CHECK(t->shape == p.shape, path << ": tensor '" << p.name << "' has shape " << shape_text(t->shape)
                                       << ", the model needs " << shape_text(p.shape));
    auto [rows, cols] = as_2d(p.shape);
    plan.sources[i] = {t, false, rows, cols, false};
    used[t] = true;
  }
  for (const auto& [t, u] : used)
    DS_CHECK(u, path << ": tensor '" << excerpt(t->name) << "' is not a parameter of this model");
  return plan;
}

BareNames bare_names(const std::string& path, const Architecture& arch,
                     const std::vector<const SafetensorsTensor*>& all) {
  BareNames bare;
  for (const auto* t : all) {
    std::string_view n = t->name;
    for (auto pre : arch.prefixes)
      if (n.substr(0, pre.size()) == pre) n.remove_prefix(pre.size());
    auto [it, fresh] = bare.emplace(std::string(n), t);
    DS_CHECK(fresh, path << ": tensors '" << excerpt(it->second->name) << "' and '" << excerpt(t->name) << "' are the same "
                         << arch.name << " tensor (with and without a prefix)");
  }
  return bare;
}

// Each parameter's tensor by its Hugging Face name, its shape checked (or cropped: a padded vocabulary).
void plan_hf_params(const std::string& path, const Architecture& arch, const BareNames& bare,
                    std::span<const ParamInfo> params, LoadPlan& plan, UsedTensors& used) {
  const auto hf = to_hf(arch, params);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    std::string layer;
    const Rule* r = rule_for(arch, p.name, &layer);
    auto it = bare.find(hf[i].name);
    DS_CHECK(it != bare.end(), path << ": no tensor '" << hf[i].name << "'"
                                    << (arch.prefixes.empty() ? std::string() : " (or with a '" + std::string(arch.prefixes[0]) + "' prefix)")
                                    << " for the model's parameter '" << p.name << "' " << shape_text(p.shape)
                                    << " (the file's model has fewer layers, ties this tensor to another, or is another architecture?)");
    const SafetensorsTensor* t = it->second;
    auto [rows, cols] = as_2d(p.shape);
    const bool crop = r->crop_rows && t->shape.size() == 2 && p.shape.size() == 2 && t->shape[1] == p.shape[1] &&
                      t->shape[0] > p.shape[0];
    DS_CHECK(crop || t->shape == hf[i].shape,
             path << ": tensor '" << excerpt(t->name) << "' has shape " << shape_text(t->shape) << ", the model needs "
                  << shape_text(hf[i].shape)
                  << (r->transpose ? " (Conv1D layout [in, out] of its parameter '" + p.name + "' " + shape_text(p.shape) + ")"
                                   : std::string())
                  << ": the model's shape (n_layer, n_head, n_embd, block_size, vocab_size) differs from the file's");
    plan.sources[i] = {t, r->transpose, rows, cols, crop};
    used[t] = true;
  }
}

// The file's other tensors: tied copies of a loaded one, or buffers the architecture ignores.
void plan_hf_leftovers(const std::string& path, const Architecture& arch, const BareNames& bare, LoadPlan& plan,
                       UsedTensors& used) {
  for (const auto& [name, t] : bare) {
    if (used[t]) continue;
    const Tied* tie = nullptr;
    for (const auto& td : arch.tied)
      if (td.hf == name) tie = &td;
    if (tie) {
      auto orig = bare.find(tie->same_as);
      DS_CHECK(orig != bare.end() && used[orig->second] && orig->second->shape == t->shape,
               path << ": tensor '" << excerpt(t->name) << "' " << shape_text(t->shape) << " should be a tied copy of '"
                    << tie->same_as << "'" << (orig == bare.end() ? std::string(", which the file lacks")
                                                                  : " " + shape_text(orig->second->shape)));
      plan.tied.emplace_back(t, orig->second);
      continue;
    }
    bool buffer = false;
    for (auto pat : arch.ignored) buffer = buffer || match(pat, name, nullptr);
    DS_CHECK(buffer, path << ": tensor '" << excerpt(t->name) << "' " << shape_text(t->shape)
                          << " is not a parameter of this model (" << arch.name
                          << "): the file's model has more layers or another architecture?");
    ++plan.ignored;
  }
}

}  // namespace

LoadPlan plan_load(const SafetensorsReader& file, std::span<const ParamInfo> params) {
  const std::string& path = file.path();
  UsedTensors used;
  const auto all = file.tensors();
  for (const auto* t : all) used[t] = false;
  if (dstrain_layout(file)) return plan_dstrain(file, params, used);

  const Architecture* arch = detect(params);
  DS_CHECK(arch, path << ": no Hugging Face name table covers this model (its parameter '"
                      << (params.empty() ? std::string() : params.front().name) << "')");
  LoadPlan plan;
  plan.sources.resize(params.size());
  plan.naming = "Hugging Face " + std::string(arch->name) + " names";
  const BareNames bare = bare_names(path, *arch, all);
  plan_hf_params(path, *arch, bare, params, plan, used);
  plan_hf_leftovers(path, *arch, bare, plan, used);
  return plan;
}

void load(const SafetensorsReader& file, const LoadPlan& plan, std::span<const ParamInfo> params,
          std::span<const std::span<float>> out) {
  DS_CHECK(plan.sources.size() == params.size() && out.size() == params.size(),
           "hf::load: the plan is for " << plan.sources.size() << " parameters, the model has " << params.size());
  std::vector<float> tmp;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto& s = plan.sources[i];
    DS_CHECK(out[i].size() == params[i].numel(), "hf::load: parameter '" << params[i].name << "' has "
                                                                          << params[i].numel() << " elements, its buffer " << out[i].size());
    if (!s.transpose && !s.crop) {
      file.read_f32(s.tensor->name, out[i]);
      continue;
    }
    tmp.resize(s.tensor->numel());
    file.read_f32(s.tensor->name, tmp);
    if (s.transpose)
      transpose(tmp.data(), out[i].data(), s.rows, s.cols);
    else
      std::copy_n(tmp.data(), out[i].size(), out[i].data());
  }
  // A tied copy must equal its original: an untied model would load silently wrong.
  std::vector<float> a, b;
  for (const auto& [copy, orig] : plan.tied) {
    a.resize(copy->numel());
    b.resize(orig->numel());
    file.read_f32(copy->name, a);
    file.read_f32(orig->name, b);
    DS_CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0,
             file.path() << ": tensor '" << copy->name << "' differs from '" << orig->name
                         << "': the file's model does not tie them, and this model shares one tensor for both");
  }
}

}  // namespace ds::io::hf
