// Writes a tiny Llama's weights, a batch, our logits, loss and gradients for llama_vs_torch.py,
// which rebuilds the model in plain PyTorch and compares.
//   llama_torch_dump OUT_PREFIX n_layer n_head n_kv_head n_embd intermediate block vocab tie B T
// OUT_PREFIX.txt: the config line "n_layer n_head n_kv_head n_embd intermediate block vocab tie
// B T rope_theta eps", then "name numel" per parameter. OUT_PREFIX.bin (little-endian):
// parameters (fp32, in order), inputs and targets (int32, B*T each), logits (fp32, B*T*V),
// the mean loss (fp32), gradients (fp32, in order).
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "ds/nn/llama.h"
#include "model_harness.h"

int main(int argc, char** argv) {
  if (argc != 12) {
    std::fprintf(stderr, "usage: llama_torch_dump OUT_PREFIX n_layer n_head n_kv_head n_embd intermediate block vocab tie B T\n");
    return 2;
  }
  auto arg = [&](int i) { return std::atoll(argv[i]); };
  ds::nn::LlamaConfig c;
  c.n_layer = arg(2);
  c.n_head = arg(3);
  c.n_kv_head = arg(4);
  c.n_embd = arg(5);
  c.intermediate_size = arg(6);
  c.block_size = arg(7);
  c.vocab_size = arg(8);
  c.tie_embeddings = arg(9) != 0;
  const std::int64_t B = arg(10), T = arg(11), V = c.vocab_size;
  ds::nn::Llama m(c);
  dstest::Harness h(m, 1);
  // Weights well away from the init's near-uniform logits: matrices N(0, 0.2), norms 1 + N(0, 0.1).
  std::mt19937_64 g(42);
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (std::size_t i = 0; i < h.master.size(); ++i)
    for (float& v : h.master[i]) v = h.infos[i].shape.size() == 1 ? 1.0f + 0.1f * d(g) : 0.2f * d(g);
  h.rebind();
  std::vector<std::int32_t> in(std::size_t(B * T)), tg(in.size());
  for (auto& x : in) x = std::int32_t(g() % std::uint64_t(V));
  for (auto& x : tg) x = std::int32_t(g() % std::uint64_t(V));
  ds::Batch b;
  b.inputs = in;
  b.targets = tg;
  b.batch = B;
  b.seq = T;
  // Every position's logits: logits_last of each prefix (a causal model's row t sees tokens <= t).
  std::vector<float> logits;
  for (std::int64_t s = 0; s < B; ++s)
    for (std::int64_t t = 1; t <= T; ++t) {
      const auto row = m.logits_last(std::span<const std::int32_t>(in.data() + s * T, std::size_t(t)));
      logits.insert(logits.end(), row.begin(), row.end());
    }
  const float loss = m.forward(b);
  m.backward(1.0f, {});
  const std::string prefix = argv[1];
  FILE* txt = std::fopen((prefix + ".txt").c_str(), "w");
  FILE* bin = std::fopen((prefix + ".bin").c_str(), "wb");
  if (!txt || !bin) {
    std::fprintf(stderr, "llama_torch_dump: cannot write %s.txt / .bin\n", prefix.c_str());
    return 1;
  }
  const auto& r = m.config();
  std::fprintf(txt, "%lld %lld %lld %lld %lld %lld %lld %d %lld %lld %.17g %.17g\n", (long long)r.n_layer,
               (long long)r.n_head, (long long)r.n_kv_head, (long long)r.n_embd, (long long)r.intermediate_size,
               (long long)r.block_size, (long long)r.vocab_size, r.tie_embeddings ? 1 : 0, (long long)B, (long long)T,
               r.rope_theta, r.rms_norm_eps);
  for (const auto& p : h.infos) std::fprintf(txt, "%s %zu\n", p.name.c_str(), p.numel());
  for (const auto& p : h.master) std::fwrite(p.data(), 4, p.size(), bin);
  std::fwrite(in.data(), 4, in.size(), bin);
  std::fwrite(tg.data(), 4, tg.size(), bin);
  std::fwrite(logits.data(), 4, logits.size(), bin);
  std::fwrite(&loss, 4, 1, bin);
  for (std::size_t i = 0; i < h.infos.size(); ++i) {
    const auto gi = h.grad(i);
    std::fwrite(gi.data(), 4, gi.size(), bin);
  }
  const bool ok = std::fclose(txt) == 0 && std::fclose(bin) == 0;
  return ok ? 0 : 1;
}
