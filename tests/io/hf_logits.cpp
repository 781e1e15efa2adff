// hf_logits WEIGHTS N_LAYER N_HEAD N_EMBD BLOCK_SIZE VOCAB TOKENS
//
// Builds ds::nn::Gpt with that shape, fills it from WEIGHTS through the same plan and load
// `train --init_from` uses (ds/io/hf_weights.h), and prints the logits after each prefix of
// TOKENS (comma-separated): one line per position, VOCAB numbers. hf_gpt2_test.sh compares
// them with a PyTorch GPT-2 on the same weights.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <sstream>
#include <string>
#include <vector>

#include "ds/io/hf_weights.h"
#include "ds/io/safetensors.h"
#include "ds/nn/gpt.h"

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr, "usage: hf_logits WEIGHTS N_LAYER N_HEAD N_EMBD BLOCK_SIZE VOCAB TOKENS\n");
    return 2;
  }
  try {
    ds::nn::GptConfig cfg;
    cfg.n_layer = std::atoll(argv[2]);
    cfg.n_head = std::atoll(argv[3]);
    cfg.n_embd = std::atoll(argv[4]);
    cfg.block_size = std::atoll(argv[5]);
    cfg.vocab_size = std::atoll(argv[6]);
    std::vector<std::int32_t> tokens;
    std::stringstream ss(argv[7]);
    for (std::string t; std::getline(ss, t, ',');) tokens.push_back(std::int32_t(std::atoi(t.c_str())));

    ds::nn::Gpt gpt(cfg);
    gpt.set_gemm_precision(ds::nn::Precision::F32);
    const auto infos = gpt.parameters();
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
    const ds::io::SafetensorsReader file(argv[1]);
    ds::io::hf::load(file, ds::io::hf::plan_load(file, infos), infos, spans);
    gpt.bind(pv, gv);
    for (std::size_t t = 1; t <= tokens.size(); ++t) {
      const auto l = gpt.logits_last(std::span<const std::int32_t>(tokens.data(), t));
      for (std::size_t v = 0; v < l.size(); ++v) std::printf(v ? " %.9g" : "%.9g", double(l[v]));
      std::printf("\n");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_logits: error: %s\n", e.what());
    return 1;
  }
}
