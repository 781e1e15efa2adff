// Activation checkpointing of the CPU GPT and Llama (set_activation_checkpointing): the same
// loss, gradient, grad_ready and sampling bits as without it (fp32 and bf16, the GPT's
// per-thread and single-thread backward), also under poisoning group hooks (the recomputation
// is inside each block's Backward bracket); and the activation arena shrinks by exactly the
// activations of n_layer - 1 blocks.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "poison_hooks.h"
#include "small_decoders.h"

namespace {

using namespace dstest;

std::int64_t pad(std::int64_t n) { return (n + 15) / 16 * 16; }

// One block's saved activations in floats (the layouts of gpt.cpp / llama.cpp ensure_scratch).
std::int64_t gpt_block_floats(const ds::nn::GptConfig& c, std::int64_t N, std::int64_t T) {
  const std::int64_t C = c.n_embd;
  return pad(N * C) * 4 + pad(N) * 4 + pad(3 * N * C) + pad(N * c.n_head * T) + pad(4 * N * C) * 2;
}
std::int64_t llama_block_floats(const ds::nn::LlamaConfig& c, std::int64_t N, std::int64_t T) {
  const std::int64_t C = c.n_embd, KV = c.n_kv_head * (C / c.n_head), I = c.intermediate_size;
  return pad(N * C) * 5 + pad(N) * 2 + pad(N * KV) * 2 + pad(N * c.n_head * T) + pad(N * I) * 3;
}

auto ckpt_on = [](auto& m) { m.set_activation_checkpointing(true); };
auto ckpt_off = [](auto&) {};

TEST(NnActivationCheckpointing, GptSameBits) {
  const ds::nn::GptConfig cfg = gpt_cfg();
  const Data a = tokens(3, 8, cfg.vocab_size, 1), b = tokens(3, 5, cfg.vocab_size, 2);
  for (int threads : {1, 2})
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16})
      ds::test::on_threads(threads, [&] {
        const std::string what = std::string("gpt ") + dt_name(dt) + " threads " + std::to_string(threads);
        expect_same_runs<ds::nn::Gpt>(cfg, dt, a, b, true, ckpt_off, ckpt_on, false, what);
        expect_same_runs<ds::nn::Gpt>(cfg, dt, a, b, true, ckpt_off, ckpt_on, true, what + " poisoning hooks");
        return 0;
      });
}

TEST(NnActivationCheckpointing, LlamaSameBits) {
  for (bool tie : {true, false}) {
    const auto cfg = llama_cfg(tie);
    const Data a = tokens(2, 8, cfg.vocab_size, 3), b = tokens(2, 6, cfg.vocab_size, 4);
    for (ds::DType dt : {ds::DType::F32, ds::DType::BF16}) {
      const std::string what = std::string("llama ") + (tie ? "tied " : "untied ") + dt_name(dt);
      expect_same_runs<ds::nn::Llama>(cfg, dt, a, b, true, ckpt_off, ckpt_on, false, what);
      expect_same_runs<ds::nn::Llama>(cfg, dt, a, b, true, ckpt_off, ckpt_on, true, what + " poisoning hooks");
    }
  }
}

// The arena a forward allocates is activation_bytes(); checkpointing takes away exactly
// n_layer - 1 blocks' activations. Prints bytes per token (docs/user/training.md).
template <class M, class Cfg, class BlockFloats>
void arena_shrinks(const Cfg& cfg, std::int64_t B, std::int64_t T, BlockFloats block_floats, const char* name) {
  M full(cfg), ckpt(cfg);
  ckpt.set_activation_checkpointing(true);
  Harness hf(full, 1), hc(ckpt, 1);
  const Data d = tokens(B, T, cfg.vocab_size, 7);
  full.forward(d.batch);
  ckpt.forward(d.batch);
  EXPECT_EQ(full.arena_bytes(), full.activation_bytes(B, T)) << name;
  EXPECT_EQ(ckpt.arena_bytes(), ckpt.activation_bytes(B, T)) << name;
  const std::size_t block = std::size_t(block_floats(cfg, B * T, T)) * sizeof(float);
  EXPECT_EQ(full.arena_bytes() - ckpt.arena_bytes(), std::size_t(cfg.n_layer - 1) * block) << name;
  std::printf("%s: activation arena %.0f bytes/token without checkpointing, %.0f with (x%.2f)\n", name,
              double(full.arena_bytes()) / double(B * T), double(ckpt.arena_bytes()) / double(B * T),
              double(full.arena_bytes()) / double(ckpt.arena_bytes()));
  // Turned off again: the full layout back.
  ckpt.set_activation_checkpointing(false);
  ckpt.forward(d.batch);
  EXPECT_EQ(ckpt.arena_bytes(), full.arena_bytes()) << name;
}

TEST(NnActivationCheckpointing, ArenaShrinksByAllButOneBlock) {
  ds::test::on_threads(2, [] {
    // The train app's default shapes (n_layer 4, n_head 4, n_embd 128, block_size 64, bytes).
    arena_shrinks<ds::nn::Gpt>(ds::nn::GptConfig{4, 4, 128, 64, 256}, 4, 64, gpt_block_floats, "gpt default");
    ds::nn::LlamaConfig lc = llama_cfg(false);
    lc.n_layer = 4;
    lc.n_embd = 128;
    lc.n_kv_head = 4;
    lc.intermediate_size = ds::nn::llama_default_intermediate(128);
    lc.block_size = 64;
    lc.vocab_size = 256;
    arena_shrinks<ds::nn::Llama>(lc, 4, 64, llama_block_floats, "llama default");
    return 0;
  });
  // The saving without allocating: GPT-2 124M's shape at T = 1024, 8 sequences, 2 threads.
  ds::test::on_threads(2, [] {
    ds::nn::Gpt big({12, 12, 768, 1024, 50257});
    const std::size_t full = big.activation_bytes(8, 1024);
    big.set_activation_checkpointing(true);
    const std::size_t ckpt = big.activation_bytes(8, 1024);
    const std::size_t block = std::size_t(gpt_block_floats(big.config(), 8 * 1024, 1024)) * sizeof(float);
    EXPECT_EQ(full - ckpt, 11 * block);
    std::printf("gpt 12x768 T=1024 B=8: activation arena %.0f bytes/token without checkpointing, %.0f with (x%.2f)\n",
                double(full) / 8192.0, double(ckpt) / 8192.0, double(full) / double(ckpt));
    return 0;
  });
}

}  // namespace
