// The pipeline section of ds_config.json: DeepSpeed's keys (runtime/config.py
// get_pipeline_config) plus partition_method, which DeepSpeed takes as a PipelineModule
// argument and dstrain, having no Python model constructor, reads here. The grid, schedules
// and partitioning are ds/pipe's, and so is the pipeline engine (ds/pipe/pipe_engine.h);
// ds::initialize's data-parallel engine refuses stages > 1 (refuse_pipeline_training) rather
// than train a pipeline config as data parallel.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ds::config {

struct PipelineConfig {
  int stages = 1;  // DeepSpeed's "auto" (the model's num_stages): 1 here
  // "parameters" | "uniform" | "type:REGEX" (ds/pipe/partition.h), as ds::pipe::PartitionMethod::text().
  std::string partition_method = "parameters";
  std::int64_t activation_checkpoint_interval = 0;  // layers per checkpointed run; 0: none
  bool seed_layers = false;                         // a different seed per layer
  // Tensor-parallel splitting of the activations and gradients sent between stages: dstrain
  // has no tensor parallelism, so these are read and have no effect.
  bool pipe_partitioned = true;
  bool grad_partitioned = true;
  bool use_reentrant = true;  // activation checkpointing's reentrant mode
};

// Throws ds::Error when p.stages > 1, naming the value, `source` and what to do instead.
void refuse_pipeline_training(const PipelineConfig& p, const std::string& source);

// The section as ds_config check prints it (parses back to the same values).
nlohmann::json pipeline_to_json(const PipelineConfig& p);

}  // namespace ds::config
