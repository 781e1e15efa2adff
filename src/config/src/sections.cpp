// The other sections of ds_config.json, one function each, following DeepSpeed's
// runtime/config.py rules (keys, types and defaults) with stricter, located errors.
#include <utility>
#include <vector>

#include "ds/mpi/comm_backends.h"
#include "reader.h"

namespace ds::config::detail {

// ---------------------------------------------------------------------------------------
// fp16 / bf16 / zero_optimization / checkpoint / csv_monitor
// ---------------------------------------------------------------------------------------

void parse_fp16(Ctx& ctx, const Member& section, Fp16Config& c) {
  Section s(ctx, section.value, section.key_pos, "fp16");
  s.boolean("enabled", c.enabled);
  s.boolean("auto_cast", c.auto_cast);
  s.number("loss_scale", c.loss_scale, at_least(0));
  s.integer("initial_scale_power", c.initial_scale_power, 0, 127);
  s.integer("loss_scale_window", c.loss_scale_window, 0);
  s.integer("hysteresis", c.hysteresis, 0);
  s.boolean("consecutive_hysteresis", c.consecutive_hysteresis);
  s.number("min_loss_scale", c.min_loss_scale, any_number());
  s.only_default("fp16_master_weights_and_grads", false,
                 "fp16 master weights are not supported: dstrain keeps fp32 master weights");
  s.finish();
}

void parse_bf16(Ctx& ctx, const Member& section, Bf16Config& c) {
  Section s(ctx, section.value, section.key_pos, section.key);
  s.boolean("enabled", c.enabled);
  s.boolean("check_grad_overflow", c.check_grad_overflow);
  if (const Member* m = s.get("immediate_grad_update", false)) s.read_bool(*m);
  s.only_default("bf16_master_weights_and_grads", false,
                 "bf16 master weights are not supported: dstrain keeps fp32 master weights");
  s.only_default("bf16_optimizer_states", false,
                 "bf16 optimizer states are not supported: dstrain keeps fp32 optimizer states");
  s.finish();
}

namespace {

// A stage-3 key read under its stage3_ name or its bare name (DeepSpeed's populate_by_name):
// the member written (nullptr when neither is, or "auto"); both written is an error naming both.
const Member* stage3_key(Section& s, const std::string& bare, bool supported = true) {
  const std::string prefixed = "stage3_" + bare;
  const Member* a = s.get(prefixed, supported);
  const Member* b = s.get(bare, false);
  if (a && b) {
    const bool b_later = std::pair(b->key_pos.line, b->key_pos.column) > std::pair(a->key_pos.line, a->key_pos.column);
    const Member* later = b_later ? b : a;
    s.ctx().fail(later->key_pos, s.sub(later->key),
                 "both " + s.sub(prefixed) + " and " + s.sub(bare) + " are given; they are two names of one "
                 "setting (DeepSpeed asserts this): write one of them");
  }
  return a ? a : b;
}

// The stage-3 keys (DeepSpeed's defaults are ZeroConfig's). The keys dstrain does not act on
// warn only at stage 3, and only for a value that would change what DeepSpeed does; below
// stage 3 DeepSpeed ignores every one of them, and so does dstrain, silently.
void parse_stage3_keys(Section& s, ZeroConfig& c) {
  Ctx& ctx = s.ctx();
  const bool stage3 = c.stage == 3;
  auto size = [&](const char* bare, std::int64_t& out) {
    if (const Member* m = stage3_key(s, bare)) out = s.read_int(*m, 0, kIntMax);
  };
  size("prefetch_bucket_size", c.prefetch_bucket_size);
  size("param_persistence_threshold", c.param_persistence_threshold);
  size("model_persistence_threshold", c.model_persistence_threshold);
  size("max_live_parameters", c.max_live_parameters);
  size("max_reuse_distance", c.max_reuse_distance);

  // gather_16bit_weights_on_model_save, also under its deprecated fp16 spelling (DeepSpeed
  // remaps it with a warning and asserts when the old and the new name are both given).
  const Member* g = stage3_key(s, "gather_16bit_weights_on_model_save");
  const std::string old_key = "stage3_gather_fp16_weights_on_model_save";
  if (const Member* d = s.get(old_key, false)) {
    if (g) {
      ctx.fail(d->key_pos, s.sub(old_key),
               "the deprecated name of " + s.sub(g->key) + ", which is also given (DeepSpeed asserts this): "
               "remove " + old_key);
    }
    ctx.warn(d->key_pos, s.sub(old_key) + " is deprecated; write stage3_gather_16bit_weights_on_model_save "
                         "(the value is used)");
    g = d;
  }
  if (g) c.gather_16bit_weights_on_model_save = s.read_bool(*g);

  if (const Member* m = s.get("sub_group_size")) {
    c.sub_group_size = s.read_int(*m, 0, kIntMax);
    // It sizes the pieces of the optimizer state swapped through NVMe (offload_optimizer,
    // read before this); without that the rank's whole partition is stepped at once.
    if (stage3 && !c.offload_optimizer.nvme() && c.sub_group_size != ZeroConfig{}.sub_group_size) {
      ctx.warn(m->key_pos, s.sub("sub_group_size") + " " + std::to_string(c.sub_group_size) +
                               " has no effect: it acts only with offload_optimizer device \"nvme\" (the elements "
                               "stepped at once between the swap files); without it dstrain steps the rank's whole "
                               "partition at once");
    }
  }
  // Read for their types only: dstrain has one way of doing what each selects.
  if (const Member* m = stage3_key(s, "module_granularity_threshold", false)) {
    const std::int64_t v = s.read_int(*m, 0, kIntMax);
    if (stage3 && v != 0) {
      ctx.warn(m->key_pos, s.sub(m->key) + " " + std::to_string(v) + " has no effect: dstrain gathers the "
                           "parameter groups the model declares (one group per block), whatever their size");
    }
  }
  if (const Member* m = stage3_key(s, "use_all_reduce_for_fetch_params", false)) {
    if (s.read_bool(*m) && stage3) {
      ctx.warn(m->key_pos, s.sub(m->key) + " true has no effect: dstrain fetches parameters with all-gather");
    }
  }
  if (const Member* m = stage3_key(s, "allgather_sequential", false)) {
    if (s.read_bool(*m) && stage3) {
      ctx.warn(m->key_pos, s.sub(m->key) + " true has no effect: dstrain gathers each parameter group with "
                           "one all-gather");
    }
  }
}

}  // namespace

void parse_zero(Ctx& ctx, const Member& section, ZeroConfig& c) {
  if (section.value.kind == K::Bool) {
    // Deprecated bool form: true is stage 1 with allgather_bucket_size from "allgather_size".
    c.stage = section.value.boolean ? 1 : 0;
    ctx.warn(section.key_pos, std::string("\"zero_optimization\": ") + (section.value.boolean ? "true" : "false") +
                                  " is deprecated; write {\"stage\": " + std::to_string(c.stage) + "}");
    return;
  }
  Section s(ctx, section.value, section.key_pos, "zero_optimization");
  if (const Member* m = s.get("stage")) {
    const std::int64_t st = s.read_int(*m, 0, 3);
    c.stage = static_cast<int>(st);
  }
  // Keys whose DeepSpeed alternatives dstrain does not implement: dstrain always does what
  // the default value means, so the other value is read, kept, and warned about once.
  auto fixed_behaviour = [&](const char* key, bool& out, bool dstrain_value, const std::string& what) {
    const Member* m = s.get(key);
    if (!m) return;
    out = s.read_bool(*m);
    if (out != dstrain_value) {
      ctx.warn(m->key_pos, s.sub(key) + " " + (out ? "true" : "false") + " has no effect: " + what);
    }
  };
  fixed_behaviour("contiguous_gradients", c.contiguous_gradients, true,
                  "dstrain always keeps gradients in one contiguous flat buffer");
  // reduce_scatter: both values match what dstrain does (docs/user/config.md); it feeds the
  // stage-2 cross-key check below.
  s.boolean("reduce_scatter", c.reduce_scatter);
  // DeepSpeed accepts 0 for both sizes. reduce: a bucket is reduced once it cannot take the
  // next gradient, so 0 reduces every gradient on its own, as a bucket of 1 element does.
  // allgather: DeepSpeed gathers each partition whole (all_gather_into_tensor ignores the
  // size), so 0 is no limit.
  if (const Member* m = s.get("reduce_bucket_size")) {
    c.reduce_bucket_size = s.read_int(*m, 0, kIntMax);
    if (c.reduce_bucket_size == 0) {
      c.reduce_bucket_size = 1;
      ctx.warn(m->key_pos, s.sub("reduce_bucket_size") + " 0: every gradient is reduced on its own (as a bucket of "
                           "one element; slow with many small parameters)");
    }
  }
  if (const Member* m = s.get("allgather_bucket_size")) {
    c.allgather_bucket_size = s.read_int(*m, 0, kIntMax);
    if (c.allgather_bucket_size % 2 != 0) s.type_error(*m, "an even integer (DeepSpeed asserts a multiple of 2)");
    if (c.allgather_bucket_size == 0) {
      c.allgather_bucket_size = kIntMax - 1;  // even, and larger than any partition
      ctx.warn(m->key_pos, s.sub("allgather_bucket_size") + " 0: each rank's updated partition is gathered whole "
                           "(no size limit), as DeepSpeed gathers it");
    }
  }
  fixed_behaviour("allgather_partitions", c.allgather_partitions, true,
                  "dstrain always all-gathers the updated partitions (no per-rank broadcasts)");
  if (const Member* m = s.get("overlap_comm")) {
    if (m->value.kind == K::Null) {
      c.overlap_comm.reset();
    } else {
      c.overlap_comm = s.read_bool(*m);
      // At stage 3 false has an effect: no prefetching, each reduce-scatter waited at once.
      if (!*c.overlap_comm && c.stage != 3) {
        ctx.warn(m->key_pos, s.sub("overlap_comm") + " false has no effect: dstrain always overlaps the "
                             "gradient reduction with the backward pass");
      }
    }
  }
  // Before the stage-3 keys: sub_group_size's warning depends on offload_optimizer.
  parse_offload_sections(s, c);
  s.only_default("legacy_stage1", false, "legacy_stage1 was removed from DeepSpeed and is not supported");
  check_zero_features(s);
  s.accept({"cpu_offload_use_pin_memory", "use_multi_rank_bucket_allreduce", "load_from_fp32_weights",
            "elastic_checkpoint", "ignore_unused_parameters", "round_robin_gradients",
            "memory_efficient_linear", "mics_shard_size",
            "mics_hierarchical_params_gather", "pipeline_loading_checkpoint", "log_trace_cache_warnings",
            "leaf_module", "override_module_apply", "zeropp_loco_param"});
  parse_stage3_keys(s, c);
  s.finish();
}

void parse_data_types(Ctx& ctx, const Member& section, DataTypesConfig& c) {
  Section s(ctx, section.value, section.key_pos, "data_types");
  if (const Member* m = s.get("grad_accum_dtype"); m && m->value.kind != K::Null) {
    const std::string expected = "\"fp32\", \"fp16\" or \"bf16\"";
    if (m->value.kind != K::String) s.type_error(*m, expected);
    const std::string v = lower(m->value.str);
    if (v != "fp32" && v != "fp16" && v != "bf16") s.type_error(*m, expected);
    c.grad_accum_dtype = v;
  }
  // DeepSpeed reads these too; dstrain's parameters follow fp16/bf16.enabled.
  s.accept({"param_dtype", "buffer_dtype"});
  s.finish();
}

void parse_checkpoint(Ctx& ctx, const Member& section, CheckpointConfig& c) {
  Section s(ctx, section.value, section.key_pos, "checkpoint");
  if (const Member* m = s.get("tag_validation")) {
    const std::string v = lower(s.read_string(*m));
    if (v == "ignore") c.tag_validation = "Ignore";
    else if (v == "warn") c.tag_validation = "Warn";
    else if (v == "fail") c.tag_validation = "Fail";
    else s.type_error(*m, "\"Ignore\", \"Warn\" or \"Fail\"");
  }
  s.boolean("async_save", c.async_save);
  s.integer("io_threads", c.io_threads, 0, 64);
  s.accept({"load_universal", "use_node_local_storage", "parallel_write", "checkpoint_serialization", "writer"});
  s.finish();
}

void parse_monitor(Ctx& ctx, const Member& section, MonitorConfig& c) {
  Section s(ctx, section.value, section.key_pos, section.key);
  s.boolean("enabled", c.enabled);
  s.string("output_path", c.output_path);
  s.string("job_name", c.job_name);
  s.finish();
}

// comms_config is a name people also write with DeepSpeed-style keys (verbose, ...) that
// DeepSpeed ignores: dstrain's timeout moved to communication.timeout; here the old spelling
// still works with a deprecation warning and every other key is ignored with a warning.
void parse_comms_config(Ctx& ctx, const Member& section, CommsConfig& c) {
  if (section.value.kind != K::Object) {
    ctx.warn(section.key_pos, "comms_config is ignored (DeepSpeed ignores it; dstrain's settings are in "
                              "\"communication\")");
    return;
  }
  Section s(ctx, section.value, section.key_pos, "comms_config");
  if (const Member* m = s.get("timeout")) {
    c.timeout = s.read_number(*m, Range{0, 1e9});
    ctx.warn(m->key_pos, "comms_config.timeout is deprecated (comms_config is a DeepSpeed section name): "
                         "write communication.timeout");
  }
  for (const Member& m : section.value.members) {
    if (m.key == "timeout") continue;
    s.accept({m.key.c_str()});
    // verbose, prof_all, ...: most likely meant for DeepSpeed's communication logger.
    const std::string logger = section_of(m.key, "comms_config") == "comms_logger"
                                   ? "; the communication logger's keys go in \"comms_logger\""
                                   : "";
    ctx.warn(m.key_pos, "comms_config." + m.key + " is ignored (DeepSpeed ignores comms_config; dstrain's "
                        "communication settings are in \"communication\"" + logger + ")");
  }
  s.finish();
}

namespace {
void choice(Section& s, const std::string& key, std::string& out, const std::vector<std::string>& choices);

// "auto", then the communicators whose buffers are device memory, from their table.
std::vector<std::string> device_backend_choices() {
  std::vector<std::string> choices = {"auto"};
  for (const CommBackend& b : comm_backends())
    if (b.device_memory) choices.emplace_back(b.name);
  return choices;
}
}  // namespace

// dstrain extensions: the knobs that were environment variables.
void parse_communication(Ctx& ctx, const Member& section, CommunicationConfig& c, CommsConfig& timeout) {
  Section s(ctx, section.value, section.key_pos, "communication");
  s.number("timeout", timeout.timeout, Range{0, 1e9});
  s.boolean("shared_memory", c.shared_memory);
  s.boolean("progress_thread", c.progress_thread);
  choice(s, "device_backend", c.device_backend, device_backend_choices());
  s.finish();
}

// DeepSpeed's keys and defaults; the engine checks the prof_ops names against the collectives
// it records (the communicator library holds that table).
void parse_comms_logger(Ctx& ctx, const Member& section, CommsLoggerConfig& c) {
  Section s(ctx, section.value, section.key_pos, "comms_logger");
  s.boolean("enabled", c.enabled);
  s.boolean("verbose", c.verbose);
  s.boolean("prof_all", c.prof_all);
  if (const Member* m = s.get("prof_ops"); m && m->value.kind != K::Null) {
    const char* expected = "a list of collective names such as [\"all_reduce\", \"all_gather\"]";
    if (m->value.kind != K::Array) s.type_error(*m, expected);
    c.prof_ops.clear();
    for (const JsonNode& op : m->value.items) {
      if (op.kind != K::String) s.type_error(*m, expected);
      c.prof_ops.push_back(op.str);
    }
  }
  s.boolean("debug", c.debug);
  s.finish();
}

namespace {

// One of `choices` (case-insensitive), stored as written in the list.
void choice(Section& s, const std::string& key, std::string& out, const std::vector<std::string>& choices) {
  const bool auto_is_a_choice = std::find(choices.begin(), choices.end(), "auto") != choices.end();
  const Member* m = auto_is_a_choice ? s.get_raw(key) : s.get(key);
  if (!m) return;
  std::string expected;
  for (size_t i = 0; i < choices.size(); ++i) {
    expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + jquote(choices[i]);
  }
  if (m->value.kind != K::String) s.type_error(*m, expected);
  const std::string v = lower(m->value.str);
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) s.type_error(*m, expected);
  out = v;
}

}  // namespace

void parse_kernels(Ctx& ctx, const Member& section, KernelsConfig& c) {
  Section s(ctx, section.value, section.key_pos, "kernels");
  choice(s, "attention", c.attention, {"auto", "materialized", "flash"});
  s.integer("attention_block", c.attention_block, 1);
  choice(s, "cpu_bf16_gemm", c.cpu_bf16_gemm, {"auto", "on", "off"});
  s.finish();
}

}  // namespace ds::config::detail
