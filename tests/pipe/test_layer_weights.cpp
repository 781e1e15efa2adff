// The partition input of the built-in GPT (layer_infos over its LayerSequence side) and the
// stages partition_layers makes of it with DeepSpeed's three partition_method kinds.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/pipe/layer_weights.h"

using ds::pipe::LayerInfo;
using ds::pipe::PartitionMethod;
using ds::pipe::partition_layers;
using ds::pipe::StageBounds;

namespace {

// 6 blocks of n_embd 32 between a large tied embedding (vocab 2000) and the final norm.
const ds::nn::GptConfig kCfg{6, 4, 32, 16, 2000};
constexpr std::int64_t kC = 32, kV = 2000, kBlock = 16;

std::vector<LayerInfo> gpt_layers() {
  ds::nn::Gpt m(kCfg);
  return ds::pipe::layer_infos(m, m.parameters());
}

StageBounds stages_of(int stages, const std::string& method) {
  return partition_layers(gpt_layers(), stages, PartitionMethod::parse(method));
}

}  // namespace

TEST(PipeLayerInfos, GptNamesAndCountsWithTheTiedHead) {
  const std::vector<LayerInfo> layers = gpt_layers();
  ASSERT_EQ(layers.size(), 8u);
  EXPECT_EQ(layers[0].name, "embed");
  EXPECT_EQ(layers[0].parameters, kV * kC + kBlock * kC);  // wte, wpe
  for (int l = 1; l <= 6; ++l) {
    EXPECT_EQ(layers[l].name, "h." + std::to_string(l - 1));
    EXPECT_EQ(layers[l].parameters, 12 * kC * kC + 13 * kC);  // 4 Linear weights and biases, 2 LayerNorms
  }
  EXPECT_EQ(layers[7].name, "head");
  EXPECT_EQ(layers[7].parameters, 2 * kC + kV * kC);  // ln_f and the tied wte again
}

TEST(PipeLayerInfos, LlamaUntiedHeadCountsItsOwnMatrix) {
  ds::nn::LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.n_embd = 8;
  c.intermediate_size = 12;
  c.block_size = 4;
  c.vocab_size = 50;
  for (bool tie : {false, true}) {
    c.tie_embeddings = tie;
    ds::nn::Llama m(c);
    const std::vector<LayerInfo> layers = ds::pipe::layer_infos(m, m.parameters());
    ASSERT_EQ(layers.size(), 4u);
    EXPECT_EQ(layers[0].parameters, 50 * 8);
    EXPECT_EQ(layers[3].parameters, 8 + 50 * 8) << (tie ? "tied" : "untied");  // norm + head (own or tied)
  }
}

TEST(PipeLayerInfos, GptPartitions) {
  // uniform: by layer count, the remainder on the first stages.
  EXPECT_EQ(stages_of(2, "uniform"), (StageBounds{0, 4, 8}));
  EXPECT_EQ(stages_of(3, "uniform"), (StageBounds{0, 3, 6, 8}));
  // parameters: embed 64512, blocks 12704 each, head 64064 -> embed | h.0 .. h.5 | head
  // (64512, 76224, 64064: spread 12160, against 13248 for | h.0 .. h.4 | and 13696 for
  // embed + h.0 | h.1 .. h.5 |).
  EXPECT_EQ(stages_of(3, "parameters"), (StageBounds{0, 1, 7, 8}));
  EXPECT_EQ(stages_of(2, "parameters"), (StageBounds{0, 4, 8}));  // 102624 | 102176
  // type:h\. counts the blocks only: 3 and 3, then 2, 2 and 2.
  EXPECT_EQ(stages_of(2, "type:h\\."), (StageBounds{0, 4, 8}));
  EXPECT_EQ(stages_of(3, "type:h\\."), (StageBounds{0, 3, 5, 8}));
}
