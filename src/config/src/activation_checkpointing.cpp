// The activation_checkpointing section: DeepSpeed's keys and defaults. Giving the section is
// what turns recomputation on (the train app, docs/user/training.md); every other key tunes a
// part of DeepSpeed's implementation that dstrain's CPU models do not have, so a value other
// than the default is kept and warned about once as having no effect.
#include "reader.h"

namespace ds::config::detail {

void parse_activation_checkpointing(Ctx& ctx, const Member& section, ActivationCheckpointingConfig& c) {
  Section s(ctx, section.value, section.key_pos, "activation_checkpointing");
  c.enabled = true;
  auto flag = [&](const char* key, bool& out, const char* why) {
    if (const Member* m = s.get(key)) {
      out = s.read_bool(*m);
      if (out) ctx.warn(m->key_pos, s.sub(key) + " true has no effect: " + why);
    }
  };
  flag("partition_activations", c.partition_activations,
       "it splits the checkpoints across model-parallel ranks, and dstrain has no model parallelism");
  flag("cpu_checkpointing", c.cpu_checkpointing, "the built-in CPU models keep their checkpoints in host memory already");
  flag("contiguous_memory_optimization", c.contiguous_memory_optimization,
       "the checkpoints already live in the model's one contiguous activation arena");
  if (const Member* m = s.get("number_checkpoints"); m && m->value.kind != K::Null) {
    c.number_checkpoints = s.read_int(*m, 1, kIntMax);
    ctx.warn(m->key_pos, s.sub("number_checkpoints") + " " + std::to_string(*c.number_checkpoints) +
                             " has no effect: the models keep every block's input (DeepSpeed uses it to size "
                             "the contiguous buffer of contiguous_memory_optimization)");
  }
  flag("synchronize_checkpoint_boundary", c.synchronize_checkpoint_boundary,
       "it synchronizes a CUDA device, and the CPU models run synchronously");
  flag("profile", c.profile, "dstrain does not time the checkpointed blocks (wall_clock_breakdown times the step)");
  s.finish();
}

}  // namespace ds::config::detail
