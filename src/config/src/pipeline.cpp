// The pipeline section (ds/config/pipeline_config.h): DeepSpeed's keys and defaults, the
// partition method checked by ds/pipe's own parser, so a bad value fails when the config is
// read, at its line.
#include "ds/config/pipeline_config.h"

#include "ds/pipe/partition.h"
#include "reader.h"

namespace ds::config {

namespace detail {

void parse_pipeline(Ctx& ctx, const Member& section, PipelineConfig& c) {
  Section s(ctx, section.value, section.key_pos, "pipeline");
  // "auto" is DeepSpeed's default here (the stages come from the model), not the Hugging Face
  // placeholder: read raw, and it means 1.
  if (const Member* m = s.get_raw("stages"); m && !is_auto(m->value)) {
    c.stages = static_cast<int>(s.read_int(*m, 1, std::numeric_limits<int>::max()));
  }
  if (const Member* m = s.get("partition_method")) {
    try {
      c.partition_method = pipe::PartitionMethod::parse(s.read_string(*m)).text();
    } catch (const ds::Error& e) {
      ctx.fail(m->key_pos, s.sub("partition_method"), e.message());
    }
  }
  // DeepSpeed's own "partition" key ("best") is read by nothing in DeepSpeed either.
  if (const Member* m = s.get("partition", false)) {
    if (s.read_string(*m) != "best") {
      ctx.warn(m->key_pos, s.sub("partition") + " has no effect (DeepSpeed's engine does not read it either); the "
                           "stages are split by pipeline.partition_method");
    }
  }
  s.integer("activation_checkpoint_interval", c.activation_checkpoint_interval, 0);
  s.boolean("seed_layers", c.seed_layers);
  s.boolean("pipe_partitioned", c.pipe_partitioned);
  s.boolean("grad_partitioned", c.grad_partitioned);
  s.boolean("use_reentrant", c.use_reentrant);
  s.finish();
}

}  // namespace detail

void refuse_pipeline_training(const PipelineConfig& p, const std::string& source) {
  DS_CHECK(p.stages <= 1, source << ": pipeline.stages " << p.stages
                                 << ": ds::initialize trains data parallel only; a pipeline trains through "
                                    "ds::pipe::PipeEngine (ds/pipe/pipe_engine.h), as `train` does for pipeline.stages > 1");
}

nlohmann::json pipeline_to_json(const PipelineConfig& p) {
  return {{"stages", p.stages},
          {"partition_method", p.partition_method},
          {"activation_checkpoint_interval", p.activation_checkpoint_interval},
          {"seed_layers", p.seed_layers},
          {"pipe_partitioned", p.pipe_partitioned},
          {"grad_partitioned", p.grad_partitioned},
          {"use_reentrant", p.use_reentrant}};
}

}  // namespace ds::config
