// hf_logits WEIGHTS N_LAYER N_HEAD N_EMBD BLOCK_SIZE VOCAB TOKENS
// hf_logits --llama WEIGHTS N_HEAD ROPE_THETA RMS_NORM_EPS TOKENS
//
// Builds ds::nn::Gpt with that shape, or ds::nn::Llama with the shape its weights imply (layers,
// width, key/value heads, MLP width, vocabulary, tied when there is no lm_head.weight), fills it
// from WEIGHTS through the same plan and load `train --init_from` uses (ds/io/hf_weights.h),
// and prints the logits after each prefix of TOKENS (comma-separated): one line per position,
// VOCAB numbers. hf_gpt2_test.sh and the Llama tutorial's test compare them with PyTorch on
// the same weights.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/io/hf_weights.h"
#include "ds/io/safetensors.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"

namespace {

std::vector<std::int32_t> parse_tokens(const char* s) {
  std::vector<std::int32_t> tokens;
  std::stringstream ss(s);
  for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::int32_t(std::atoi(t.c_str())));
  return tokens;
}

// The Llama shape a Hugging Face state dict implies; n_head and the two scalars come from argv.
ds::nn::LlamaConfig llama_shape(const ds::io::SafetensorsReader& f, std::int64_t n_head, double theta,
                                double eps, std::int64_t block) {
  auto shape = [&](const std::string& name) {
    const auto* t = f.find(name);
    DS_CHECK(t, f.path() << ": no tensor '" << name << "'");
    return t->shape;
  };
  ds::nn::LlamaConfig c;
  c.n_head = n_head;
  c.vocab_size = shape("model.embed_tokens.weight")[0];
  c.n_embd = shape("model.embed_tokens.weight")[1];
  c.n_kv_head = shape("model.layers.0.self_attn.k_proj.weight")[0] / (c.n_embd / n_head);
  c.intermediate_size = shape("model.layers.0.mlp.gate_proj.weight")[0];
  c.n_layer = 0;
  while (f.find("model.layers." + std::to_string(c.n_layer) + ".input_layernorm.weight")) ++c.n_layer;
  c.block_size = block;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.tie_embeddings = f.find("lm_head.weight") == nullptr;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const bool llama = argc > 1 && std::string(argv[1]) == "--llama";
  if ((!llama && argc != 8) || (llama && argc != 7)) {
    std::fprintf(stderr,
                 "usage: hf_logits WEIGHTS N_LAYER N_HEAD N_EMBD BLOCK_SIZE VOCAB TOKENS\n"
                 "       hf_logits --llama WEIGHTS N_HEAD ROPE_THETA RMS_NORM_EPS TOKENS\n");
    return 2;
  }
  try {
    const ds::io::SafetensorsReader file(argv[llama ? 2 : 1]);
    const std::vector<std::int32_t> tokens = parse_tokens(argv[llama ? 6 : 7]);
    std::unique_ptr<ds::Module> model;
    std::function<std::vector<float>(std::span<const std::int32_t>)> logits_last;
    if (llama) {
      auto m = std::make_unique<ds::nn::Llama>(llama_shape(file, std::atoll(argv[3]), std::atof(argv[4]),
                                                           std::atof(argv[5]), std::int64_t(tokens.size())));
      m->set_gemm_precision(ds::nn::Precision::F32);
      logits_last = [p = m.get()](std::span<const std::int32_t> ctx) { return p->logits_last(ctx); };
      model = std::move(m);
    } else {
      ds::nn::GptConfig cfg;
      cfg.n_layer = std::atoll(argv[2]);
      cfg.n_head = std::atoll(argv[3]);
      cfg.n_embd = std::atoll(argv[4]);
      cfg.block_size = std::atoll(argv[5]);
      cfg.vocab_size = std::atoll(argv[6]);
      auto m = std::make_unique<ds::nn::Gpt>(cfg);
      m->set_gemm_precision(ds::nn::Precision::F32);
      logits_last = [p = m.get()](std::span<const std::int32_t> ctx) { return p->logits_last(ctx); };
      model = std::move(m);
    }
    const auto infos = model->parameters();
    std::vector<std::vector<float>> w, g;
    std::vector<std::span<float>> spans;
    std::vector<ds::TensorView> pv, gv;
    for (const auto& p : infos) {
      w.emplace_back(p.numel());
      g.emplace_back(p.numel());
    }
    for (std::size_t i = 0; i < infos.size(); ++i) {
      spans.emplace_back(w[i]);
      pv.push_back({w[i].data(), w[i].size(), ds::DType::F32});
      gv.push_back({g[i].data(), g[i].size(), ds::DType::F32});
    }
    ds::io::hf::load(file, ds::io::hf::plan_load(file, infos), infos, spans);
    model->bind(pv, gv);
    for (std::size_t t = 1; t <= tokens.size(); ++t) {
      const auto l = logits_last(std::span<const std::int32_t>(tokens.data(), t));
      for (std::size_t v = 0; v < l.size(); ++v) std::printf(v ? " %.9g" : "%.9g", double(l[v]));
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_logits: error: %s\n", e.what());
    return 1;
  }
}
