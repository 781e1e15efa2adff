// Stage partitioning against DeepSpeed's ds_utils.partition_uniform / partition_balanced
// (runtime/utils.py): small cases worked out by hand from its rules -- uniform chunks with
// the remainder on the first parts; balanced by the spread (largest part minus smallest),
// ties to the later split -- and PipelineModule's partition_method values over named layers.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/pipe/partition.h"

using ds::pipe::LayerInfo;
using ds::pipe::PartitionMethod;
using ds::pipe::partition_balanced;
using ds::pipe::partition_layers;
using ds::pipe::partition_uniform;
using ds::pipe::StageBounds;

namespace {

std::string error_of(const std::vector<LayerInfo>& layers, int stages, const std::string& method) {
  try {
    partition_layers(layers, stages, PartitionMethod::parse(method));
  } catch (const ds::Error& e) {
    return e.message();
  }
  return {};
}

// A GPT-like sequence: a large embedding, four equal blocks, a small final norm + head.
const std::vector<LayerInfo> kGpt = {{"Embedding", 1000}, {"TransformerBlock", 10}, {"TransformerBlock", 10},
                                     {"TransformerBlock", 10}, {"TransformerBlock", 10}, {"NormHead", 10}};

}  // namespace

TEST(PartitionUniform, RemainderGoesToTheFirstParts) {
  EXPECT_EQ(partition_uniform(8, 4), (StageBounds{0, 2, 4, 6, 8}));
  EXPECT_EQ(partition_uniform(10, 4), (StageBounds{0, 3, 6, 8, 10}));
  EXPECT_EQ(partition_uniform(3, 5), (StageBounds{0, 1, 2, 3, 3, 3}));  // DeepSpeed leaves parts empty
  EXPECT_EQ(partition_uniform(7, 1), (StageBounds{0, 7}));
}

TEST(PartitionBalanced, EvenWeights) {
  EXPECT_EQ(partition_balanced({1, 1, 1, 1}, 2), (StageBounds{0, 2, 4}));
  EXPECT_EQ(partition_balanced({100, 10, 10, 10, 10, 100}, 2), (StageBounds{0, 3, 6}));  // 120 | 120
  EXPECT_EQ(partition_balanced({5, 5, 5}, 3), (StageBounds{0, 1, 2, 3}));
}

// Equal spreads: DeepSpeed's `>=` keeps the last split point examined.
TEST(PartitionBalanced, TiesGoToTheLaterSplit) {
  EXPECT_EQ(partition_balanced({1, 2, 1}, 2), (StageBounds{0, 2, 3}));           // 1|3 and 3|1: spread 2
  EXPECT_EQ(partition_balanced({5, 0, 0, 0, 1}, 2), (StageBounds{0, 4, 5}));     // every split: 5|1
}

// The dynamic program minimises the spread along its chosen splits: with the embedding alone
// on a stage the others are as even as they can be.
TEST(PartitionBalanced, SpreadAlongTheSplits) {
  EXPECT_EQ(partition_balanced({1000, 10, 10, 10, 10, 10}, 2), (StageBounds{0, 1, 6}));
  EXPECT_EQ(partition_balanced({1000, 10, 10, 10, 10, 10}, 3), (StageBounds{0, 1, 4, 6}));
  EXPECT_EQ(partition_balanced({0, 1, 1, 1, 1, 0}, 3), (StageBounds{0, 3, 4, 6}));  // 2 | 1 | 1
  EXPECT_EQ(partition_balanced({4, 1}, 3), (StageBounds{0, 1, 2, 2}));  // fewer items: partition_uniform
}

TEST(PartitionLayers, Methods) {
  EXPECT_EQ(partition_layers(kGpt, 2, PartitionMethod::parse("parameters")), (StageBounds{0, 1, 6}));
  EXPECT_EQ(partition_layers(kGpt, 3, PartitionMethod::parse("uniform")), (StageBounds{0, 2, 4, 6}));
  // Only the blocks count: weights 0 1 1 1 1 0.
  EXPECT_EQ(partition_layers(kGpt, 2, PartitionMethod::parse("type:BLOCK")), (StageBounds{0, 3, 6}));
  EXPECT_EQ(partition_layers(kGpt, 3, PartitionMethod::parse("type:transformer")), (StageBounds{0, 3, 4, 6}));
  EXPECT_EQ(partition_layers(kGpt, 6, PartitionMethod::parse("Uniform")), (StageBounds{0, 1, 2, 3, 4, 5, 6}));
}

TEST(PartitionMethod, ParseAndText) {
  EXPECT_EQ(PartitionMethod::parse("PARAMETERS").text(), "parameters");
  EXPECT_EQ(PartitionMethod::parse("type:Block|Head").text(), "type:Block|Head");
  EXPECT_EQ(PartitionMethod::parse("Type:a:b").type_regex, "a:b");  // the whole rest, as written
}

TEST(PartitionLayers, Errors) {
  EXPECT_EQ(error_of(kGpt, 7, "uniform"),
            "pipeline partition: 7 stages but the model has 6 layers; each stage needs at least one layer");
  EXPECT_EQ(error_of(kGpt, 2, "type:attention"),
            "pipeline partition: \"type:attention\" matches none of the model's 6 layer names; nothing to balance "
            "the stages by");
  EXPECT_EQ(error_of(kGpt, 2, "best"),
            "partition method \"best\" is not supported; use \"parameters\" (balanced by parameter count), "
            "\"uniform\" (by layer count) or \"type:REGEX\" (by the layers whose name matches)");
  EXPECT_NE(error_of(kGpt, 2, "type:((").find("partition method \"type:((\": not a valid regular expression"),
            std::string::npos);
  EXPECT_NE(error_of(kGpt, 2, "type:").find("the pattern after \"type:\" is empty"), std::string::npos);
}
