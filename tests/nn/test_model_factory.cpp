// make_model: each built-in model with its hooks, and the refusals it owns (a CPU-only model or
// activation checkpointing on the GPU, a bad kernels.cpu_bf16_gemm).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/nn/model_factory.h"

namespace {

using ds::nn::ModelSpec;

ModelSpec small(const std::string& type) {
  ModelSpec s;
  s.type = type;
  s.n_layer = 1;
  s.n_head = 2;
  s.n_embd = 16;
  s.block_size = 4;
  s.vocab_size = 8;
  if (type == "llama") {
    s.n_kv_head = 2;
    s.intermediate_size = 32;
  }
  return s;
}

std::string error_of(const ModelSpec& spec, bool on_gpu, const ds::nn::ModelKernels& k,
                     const ds::nn::ModelCheckpointing& c) {
  try {
    ds::nn::make_model(spec, on_gpu, 0, k, c);
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelFactory, DecodersCarrySamplerFlopsAndCheckpointingLine) {
  ds::nn::ModelCheckpointing ckpt{true, "--activation_checkpointing", 2};
  for (const char* type : {"gpt", "llama"}) {
    auto b = ds::nn::make_model(small(type), false, 0, {}, ckpt);
    ASSERT_TRUE(b.module) << type;
    EXPECT_TRUE(b.generate) << type;
    EXPECT_GT(b.flops_per_token, 0) << type;
    EXPECT_TRUE(b.cpu_bf16_gemm) << type;
    EXPECT_FALSE(b.adapt_batch) << type;
    ASSERT_TRUE(b.checkpointing_note) << type;
    EXPECT_NE(b.checkpointing_note().find("per micro-batch of 2 x 4 tokens"), std::string::npos) << type;
    EXPECT_FALSE(ds::nn::make_model(small(type), false, 0, {}, {}).checkpointing_note) << type;
  }
}

TEST(ModelFactory, MlpReadsOneHotFeaturesOfTheWindow) {
  auto b = ds::nn::make_model(small("mlp"), false, 0, {}, {});
  ASSERT_TRUE(b.module);
  EXPECT_FALSE(b.generate);
  EXPECT_FALSE(b.cpu_bf16_gemm);
  ASSERT_TRUE(b.adapt_batch);
  const std::vector<std::int32_t> inputs = {1, 2, 3, 7}, targets = {2, 3, 7, 5};
  ds::Batch tokens;
  tokens.inputs = inputs;
  tokens.targets = targets;
  tokens.batch = 1;
  tokens.seq = 4;
  const ds::Batch m = b.adapt_batch(tokens);
  ASSERT_EQ(m.feature_dim, 4 * 8);
  ASSERT_EQ(m.targets.size(), 1u);
  EXPECT_EQ(m.targets[0], 5);  // the token after the window
  for (std::int64_t t = 0; t < 4; ++t)
    for (std::int64_t v = 0; v < 8; ++v)
      EXPECT_EQ(m.features[std::size_t(t * 8 + v)], v == inputs[std::size_t(t)] ? 1.0f : 0.0f);
}

TEST(ModelFactory, Refusals) {
  EXPECT_NE(error_of(small("mlp"), true, {}, {}).find("--model mlp runs on the CPU only"), std::string::npos);
  const std::string ckpt_gpu = error_of(small("gpt"), true, {}, {true, "activation_checkpointing in ds.json", 1});
  EXPECT_NE(ckpt_gpu.find("activation_checkpointing in ds.json: the CUDA GPT does not recompute"), std::string::npos)
      << ckpt_gpu;
  ds::nn::ModelKernels bad;
  bad.cpu_bf16_gemm = "yes";
  EXPECT_NE(error_of(small("gpt"), false, bad, {}).find("kernels.cpu_bf16_gemm"), std::string::npos);
}

TEST(ModelFactory, DeviceChoice) {
  EXPECT_FALSE(ds::nn::model_on_gpu(small("gpt"), "cpu"));
  // The Llama's GPU version runs only when asked for by name.
  EXPECT_FALSE(ds::nn::model_on_gpu(small("llama"), "auto"));
}

}  // namespace
