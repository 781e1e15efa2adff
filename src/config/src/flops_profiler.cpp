// The flops_profiler section: DeepSpeed's keys and defaults (its profiling/config.py), read
// with errors that name the key. The engine acts on it (ds/engine/flops_profiler.h).
#include "reader.h"

namespace ds::config::detail {

void parse_flops_profiler(Ctx& ctx, const Member& section, FlopsProfilerConfig& c) {
  Section s(ctx, section.value, section.key_pos, "flops_profiler");
  s.boolean("enabled", c.enabled);
  s.integer("profile_step", c.profile_step, 0);
  s.integer("module_depth", c.module_depth, -1);
  s.integer("top_modules", c.top_modules, 0);
  s.boolean("detailed", c.detailed);
  if (const Member* m = s.get("output_file")) {
    if (m->value.kind == K::Null) c.output_file.reset();
    else c.output_file = s.read_string(*m);
  }
  s.finish();
}

}  // namespace ds::config::detail
