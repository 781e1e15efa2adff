// The pipeline section of ds_config.json: DeepSpeed's keys and defaults, partition_method
// checked where it is written, the to_json round trip, and training with stages > 1 refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/config/pipeline_config.h"
#include "ds/core/error.h"

using ds::config::DsConfig;
using ds::config::parse_config_text;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_config_text(text);
  } catch (const ds::Error& e) {
    return e.message();
  }
  return {};
}

}  // namespace

TEST(PipelineConfig, DefaultsAreDeepSpeeds) {
  const DsConfig c = parse_config_text("{}");
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_EQ(c.pipeline.partition_method, "parameters");
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 0);
  EXPECT_FALSE(c.pipeline.seed_layers);
  EXPECT_TRUE(c.pipeline.pipe_partitioned);
  EXPECT_TRUE(c.pipeline.grad_partitioned);
  EXPECT_TRUE(c.pipeline.use_reentrant);
}

TEST(PipelineConfig, ReadsEveryKey) {
  const DsConfig c = parse_config_text(R"({"pipeline": {"stages": 4, "partition_method": "Uniform",
      "activation_checkpoint_interval": 2, "seed_layers": true, "pipe_partitioned": false,
      "grad_partitioned": false, "use_reentrant": false}})");
  EXPECT_EQ(c.pipeline.stages, 4);
  EXPECT_EQ(c.pipeline.partition_method, "uniform");
  EXPECT_EQ(c.pipeline.activation_checkpoint_interval, 2);
  EXPECT_TRUE(c.pipeline.seed_layers);
  EXPECT_FALSE(c.pipeline.pipe_partitioned);
  EXPECT_FALSE(c.pipeline.grad_partitioned);
  EXPECT_FALSE(c.pipeline.use_reentrant);
  EXPECT_EQ(parse_config_text(R"({"pipeline": {"partition_method": "type:Transformer"}})").pipeline.partition_method,
            "type:Transformer");
}

// DeepSpeed's own defaults ("stages": "auto", "partition": "best") load as they are.
TEST(PipelineConfig, DeepSpeedDefaultsLoad) {
  std::vector<std::string> warnings;
  const DsConfig c = parse_config_text(R"({"pipeline": {"stages": "auto", "partition": "best"}})", "<t>", &warnings);
  EXPECT_EQ(c.pipeline.stages, 1);
  EXPECT_TRUE(c.auto_values.empty());  // not the Hugging Face placeholder
  EXPECT_TRUE(warnings.empty());
  parse_config_text(R"({"pipeline": {"partition": "uniform"}})", "<t>", &warnings);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("pipeline.partition has no effect"), std::string::npos) << warnings[0];
}

TEST(PipelineConfig, ErrorsNameTheKey) {
  EXPECT_EQ(error_of(R"({"pipeline": {"stages": 0}})"),
            "<json string>:1:15: pipeline.stages: expected an integer in [1, 2147483647], got 0");
  EXPECT_EQ(error_of(R"({"pipeline": {"partition_method": "type:(("}})").substr(0, 105),
            "<json string>:1:15: pipeline.partition_method: partition method \"type:((\": not a valid regular "
            "expression");
  EXPECT_NE(error_of(R"({"pipeline": {"partition_method": "best"}})")
                .find("pipeline.partition_method: partition method \"best\" is not supported; use \"parameters\""),
            std::string::npos);
  EXPECT_NE(error_of(R"({"pipeline": {"stage": 2}})").find("unknown key in pipeline (did you mean \"stages\"?)"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"pipeline": 2})").find("pipeline: expected an object"), std::string::npos);
}

TEST(PipelineConfig, ToJsonRoundTrip) {
  const DsConfig c = parse_config_text(R"({"pipeline": {"stages": 2, "partition_method": "type:block"}})");
  const nlohmann::json j = ds::config::to_json(c);
  EXPECT_EQ(j.at("pipeline").at("stages"), 2);
  EXPECT_EQ(j.at("pipeline").at("partition_method"), "type:block");
  EXPECT_EQ(ds::config::to_json(ds::config::parse_config_json(j)), j);
}

TEST(PipelineConfig, TrainingWithStagesIsRefused) {
  const DsConfig c = parse_config_text(R"({"pipeline": {"stages": 2}})", "ds.json");
  try {
    ds::config::refuse_pipeline_training(c.pipeline, c.source);
    FAIL() << "stages 2 accepted";
  } catch (const ds::Error& e) {
    EXPECT_EQ(e.message(),
              "ds.json: pipeline.stages 2: ds::initialize trains data parallel only; a pipeline trains through "
              "ds::pipe::PipeEngine (ds/pipe/pipe_engine.h), as `train` does for pipeline.stages > 1");
  }
  EXPECT_NO_THROW(ds::config::refuse_pipeline_training(parse_config_text("{}").pipeline, "x"));
}
