// zero_optimization.offload_optimizer / offload_param (and their deprecated bool forms
// cpu_offload / cpu_offload_param), and the top-level aio section: DeepSpeed's keys and
// defaults (runtime/zero/offload_config.py, runtime/swap_tensor/aio_config.py), read into
// OffloadConfig and AioConfig. Single keys are checked here; the rules that involve the
// stage (which stages take which offload, nvme needs nvme_path) are in validate.cpp, so that
// a config built in code is held to them too.
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "reader.h"

namespace ds::config::detail {

namespace {

// One offload section. optimizer: offload_optimizer's keys, else offload_param's.
void parse_offload(Ctx& ctx, const Member& m, bool optimizer, OffloadConfig& c) {
  Section o(ctx, m.value, m.key_pos, "zero_optimization." + m.key);
  if (const Member* d = o.get("device")) {
    const std::string dev = lower(o.read_string(*d));
    if (dev != "none" && dev != "cpu" && dev != "nvme") o.type_error(*d, "\"none\", \"cpu\" or \"nvme\"");
    c.device = dev;
  }
  // DeepSpeed ignores nvme_path unless the device is nvme, and so does dstrain.
  if (const Member* p = o.get("nvme_path"); p && p->value.kind != K::Null) c.nvme_path = o.read_string(*p);
  // Optimizer: one sub-group's buffers are stepped while the next one's are read, so at least
  // two; parameters: one buffer is enough to swap a group in.
  o.integer("buffer_count", c.buffer_count, optimizer ? 2 : 1, 1 << 20);
  o.boolean("pin_memory", c.pin_memory);
  if (!optimizer) {
    o.integer("buffer_size", c.buffer_size, 1);
    o.integer("max_in_cpu", c.max_in_cpu, 1);
    // dstrain reads a group's piece from the swap file straight into its place in the gathered
    // buffer, and with "nvme" the whole partition is on the drive: these tune buffers it has not.
    const OffloadConfig d = OffloadConfig::param_defaults();
    for (const auto& [key, v, dv] : {std::tuple{"buffer_count", std::int64_t(c.buffer_count), std::int64_t(d.buffer_count)},
                                     std::tuple{"buffer_size", c.buffer_size, d.buffer_size},
                                     std::tuple{"max_in_cpu", c.max_in_cpu, d.max_in_cpu}}) {
      const Member* k = o.get(key, false);
      if (k && v != dv && c.device == "nvme")
        ctx.warn(k->key_pos, o.sub(key) + " " + std::to_string(v) + " has no effect: dstrain reads each parameter "
                             "group's piece from the swap file straight into the gathered buffer, and keeps the "
                             "whole partition on the drive");
    }
    o.finish();
    return;
  }
  o.boolean("pipeline_read", c.pipeline_read);    // dstrain always overlaps both (docs/user/offload.md)
  o.boolean("pipeline_write", c.pipeline_write);
  o.boolean("fast_init", c.fast_init);
  if (c.fast_init && c.device == "nvme") {
    ctx.warn(o.get("fast_init", false)->key_pos,
             o.sub("fast_init") + " true has no effect: dstrain's swap files start as reserved extents that read "
             "as zero, so there is no slow initialisation to skip");
  }
  if (const Member* r = o.get("ratio")) {
    c.ratio = o.read_number(*r, Range{0.0, 1.0, true, false});
    if (c.ratio != 1.0) {
      ctx.fail(r->key_pos, o.sub("ratio"),
               nlohmann::json(c.ratio).dump() + " is not supported: dstrain offloads the whole optimizer state "
               "(partial offload is not implemented); remove ratio or set it to 1");
    }
  }
  o.only_default("super_offload", false,
                 "true is not supported: it is DeepSpeed's mode for GH200 superchips; remove super_offload");
  if (const Member* p = o.get("cpuadam_cores_perc", false)) {
    const double v = o.read_number(*p, Range{0.0, 1.0, true, false});
    if (v != 0.8) {
      ctx.warn(p->key_pos, o.sub("cpuadam_cores_perc") + " " + nlohmann::json(v).dump() +
                               " has no effect: the CPU optimizer uses the OpenMP threads of the rank "
                               "(OMP_NUM_THREADS)");
    }
  }
  if (const Member* b = o.get("convert_grad_on_cpu", false)) o.read_bool(*b);  // super_offload's
  o.accept({"pipeline"});  // DeepSpeed's derived pipeline_read or pipeline_write
  o.finish();
}

// The deprecated bool (cpu_offload / cpu_offload_param): true means {"device": "cpu"} in the
// section that replaced it. DeepSpeed remaps it with a warning and asserts when the new
// section is given too.
void deprecated_cpu_offload(Section& z, const std::string& old_key, const std::string& new_key, OffloadConfig& c) {
  const Member* m = z.get(old_key, false);
  if (!m || m->value.kind == K::Null) return;
  const bool on = z.read_bool(*m);
  if (z.has(new_key)) {
    z.ctx().fail(m->key_pos, z.sub(old_key),
                 "the deprecated form of " + z.sub(new_key) + ", which is also given (DeepSpeed asserts this): "
                 "remove " + old_key);
  }
  if (on) c.device = "cpu";
  z.ctx().warn(m->key_pos, z.sub(old_key) + " is deprecated" +
                               (on ? "; write \"" + new_key + "\": {\"device\": \"cpu\"} (the value is used)"
                                   : " (replaced by " + new_key + "); false is the default: remove it"));
}

}  // namespace

void parse_offload_sections(Section& z, ZeroConfig& c) {
  for (const bool optimizer : {true, false}) {
    const std::string key = optimizer ? "offload_optimizer" : "offload_param";
    OffloadConfig& out = optimizer ? c.offload_optimizer : c.offload_param;
    if (const Member* m = z.get(key); m && m->value.kind != K::Null) parse_offload(z.ctx(), *m, optimizer, out);
    deprecated_cpu_offload(z, optimizer ? "cpu_offload" : "cpu_offload_param", key, out);
  }
  // Below stage 3 DeepSpeed ignores offload_param (its own test configs set it at stage 0):
  // accepted, with a warning saying the parameters stay where they are.
  if (c.stage != 3 && c.offload_param.enabled()) {
    const std::string written = z.has("offload_param") ? "offload_param" : "cpu_offload_param";
    const Member* m = z.get_raw(written);
    z.ctx().warn(m ? m->key_pos : SourcePos{},
                 z.sub(written) + " (device \"" + c.offload_param.device +
                     "\") is ignored below stage 3 (stage is " + std::to_string(c.stage) +
                     "), as in DeepSpeed: the parameters stay in memory, whole on every rank");
    c.offload_param.device = "none";
  }
}

void parse_aio(Ctx& ctx, const Member& section, AioConfig& c) {
  Section s(ctx, section.value, section.key_pos, "aio");
  // Requests are O_DIRECT reads and writes: whole 4 KiB blocks.
  if (const Member* m = s.get("block_size")) {
    c.block_size = s.read_int(*m, 4096, std::int64_t{1} << 30);
    if (c.block_size % 4096 != 0) s.type_error(*m, "a multiple of 4096 (O_DIRECT requests are whole 4 KiB blocks)");
  }
  s.integer("queue_depth", c.queue_depth, 1, 64);
  // intra_op_parallelism, or its older name thread_count: one setting, so not both.
  const Member* now = s.get("intra_op_parallelism");
  const Member* old = s.get("thread_count");
  if (now && old) {
    const bool old_later =
        std::pair(old->key_pos.line, old->key_pos.column) > std::pair(now->key_pos.line, now->key_pos.column);
    const Member* later = old_later ? old : now;
    ctx.fail(later->key_pos, s.sub(later->key),
             "both aio.intra_op_parallelism and aio.thread_count are given; they are two names of one setting: "
             "write one of them");
  }
  if (const Member* m = now ? now : old) c.thread_count = static_cast<int>(s.read_int(*m, 1, 64));
  // Accepted as DeepSpeed's tuning knobs; the swap reads and writes do not depend on them.
  s.boolean("single_submit", c.single_submit);
  s.boolean("overlap_events", c.overlap_events);
  if (const Member* m = s.get("use_gds")) {
    c.use_gds = s.read_bool(*m);
    if (c.use_gds) ctx.fail(m->key_pos, s.sub("use_gds"), "GPUDirect Storage is not supported; remove aio.use_gds");
  }
  s.finish();
}

}  // namespace ds::config::detail
