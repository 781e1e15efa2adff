#include "model_spec.h"

#include <cmath>
#include <optional>
#include <sstream>
#include <utility>

#include "ds/core/error.h"
#include "torch_model.h"

namespace ds::train {

namespace {

std::int64_t positive_int(const nlohmann::json& section, const char* key, std::int64_t fallback,
                          const std::string& source) {
  if (!section.contains(key)) return fallback;
  const auto& v = section.at(key);
  DS_CHECK(v.is_number_integer() && v.get<std::int64_t>() > 0,
           source << ": model." << key << " must be a positive integer, got " << v.dump());
  return v.get<std::int64_t>();
}

// A finite number > 0 (integer or not) from the section, or nullopt when the key is absent.
std::optional<double> positive_number(const nlohmann::json& section, const char* key, const std::string& source) {
  if (!section.contains(key)) return std::nullopt;
  const auto& v = section.at(key);
  DS_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0,
           source << ": model." << key << " must be a positive number, got " << v.dump());
  return v.get<double>();
}

}  // namespace

ModelSpec resolve_model_spec(const nlohmann::json& section, const TrainOptions& opts,
                             const std::string& source) {
  ModelSpec m;
  std::optional<double> rope_theta, rms_norm_eps;  // set by the section or a flag
  std::optional<bool> tie;
  if (!section.is_null()) {
    DS_CHECK(section.is_object(), source << ": \"model\" must be an object, got " << section.dump());
    static const char* known[] = {"type",       "n_layer",    "n_head",            "n_kv_head",  "n_embd",
                                  "block_size", "vocab_size", "intermediate_size", "rope_theta", "rms_norm_eps",
                                  "tie_embeddings"};
    for (const auto& [key, value] : section.items()) {
      bool ok = false;
      for (const char* k : known) ok = ok || key == k;
      DS_CHECK(ok, source << ": unknown key model." << key
                          << " (known: type, n_layer, n_head, n_kv_head, n_embd, intermediate_size, block_size, "
                             "vocab_size, rope_theta, rms_norm_eps, tie_embeddings)");
    }
    if (section.contains("type")) {
      const auto& t = section.at("type");
      DS_CHECK(t.is_string() && (t == "gpt" || t == "mlp" || t == "llama" || is_torchscript(t.get<std::string>())),
               source << ": model.type must be \"gpt\", \"mlp\", \"llama\" or \"torchscript:PATH\", got " << t.dump());
      m.type = t.get<std::string>();
    }
    m.n_layer = positive_int(section, "n_layer", m.n_layer, source);
    m.n_head = positive_int(section, "n_head", m.n_head, source);
    m.n_kv_head = positive_int(section, "n_kv_head", 0, source);
    m.intermediate_size = positive_int(section, "intermediate_size", 0, source);
    m.n_embd = positive_int(section, "n_embd", m.n_embd, source);
    m.block_size = positive_int(section, "block_size", m.block_size, source);
    m.vocab_size = positive_int(section, "vocab_size", 0, source);
    rope_theta = positive_number(section, "rope_theta", source);
    rms_norm_eps = positive_number(section, "rms_norm_eps", source);
    if (section.contains("tie_embeddings")) {
      const auto& t = section.at("tie_embeddings");
      DS_CHECK(t.is_boolean(), source << ": model.tie_embeddings must be true or false, got " << t.dump());
      tie = t.get<bool>();
    }
  }
  if (opts.model) m.type = *opts.model;
  if (opts.n_layer) m.n_layer = *opts.n_layer;
  if (opts.n_head) m.n_head = *opts.n_head;
  if (opts.n_kv_head) m.n_kv_head = *opts.n_kv_head;
  if (opts.intermediate_size) m.intermediate_size = *opts.intermediate_size;
  if (opts.n_embd) m.n_embd = *opts.n_embd;
  if (opts.block_size) m.block_size = *opts.block_size;
  for (auto [flag, value] : {std::pair{"--rope_theta", opts.rope_theta}, std::pair{"--rms_norm_eps", opts.rms_norm_eps}})
    DS_CHECK(!value || (std::isfinite(*value) && *value > 0),
             flag << " must be a positive number, got " << *value);
  if (opts.rope_theta) rope_theta = opts.rope_theta;
  if (opts.rms_norm_eps) rms_norm_eps = opts.rms_norm_eps;
  if (opts.tie_embeddings) tie = opts.tie_embeddings;
  if (m.type == "gpt" || m.type == "llama") {
    DS_CHECK(m.n_embd % m.n_head == 0, "n_embd (" << m.n_embd << ") must be divisible by n_head ("
                                                  << m.n_head << "); set --n_embd/--n_head or model.n_embd/model.n_head in "
                                                  << source);
  }
  if (m.type == "llama") {
    if (m.n_kv_head == 0) m.n_kv_head = m.n_head;
    DS_CHECK((m.n_embd / m.n_head) % 2 == 0,
             "llama: the head dim n_embd / n_head (" << m.n_embd / m.n_head
                 << ") must be even (rotary embedding); set --n_embd/--n_head or model.n_embd/model.n_head in "
                 << source);
    DS_CHECK(m.n_head % m.n_kv_head == 0,
             "llama: n_head (" << m.n_head << ") must be divisible by n_kv_head (" << m.n_kv_head
                               << "); set --n_kv_head or model.n_kv_head in " << source);
  } else {
    DS_CHECK(m.n_kv_head == 0 && m.intermediate_size == 0,
             "n_kv_head and intermediate_size are llama settings; --model " << m.type << " takes neither (from "
                                                                            << source << " or the flags)");
    const char* llama_only = rope_theta ? "rope_theta" : rms_norm_eps ? "rms_norm_eps" : tie ? "tie_embeddings" : nullptr;
    DS_CHECK(!llama_only, llama_only << " is a llama setting; --model " << m.type << " does not take it (model."
                                     << llama_only << " in " << source << " or --" << llama_only << ")");
  }
  if (rope_theta) m.rope_theta = *rope_theta;
  if (rms_norm_eps) m.rms_norm_eps = *rms_norm_eps;
  if (tie) m.tie_embeddings = *tie;
  return m;
}

}  // namespace ds::train
