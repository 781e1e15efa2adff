// The fully resolved config as JSON, with DeepSpeed's key names, so that the output is itself
// a valid ds_config.json that parses back to the same config (tests check the round trip).
#include "ds/config/parse.h"

#include <type_traits>
#include <variant>

#include "ds/config/registry.h"

namespace ds::config {

namespace {

using nlohmann::json;

// One parameter of a descriptor's schema (ds/config/registry.h), as the parser reads it. A
// fixed value shows the default; unset optional values show what they mean (another key's
// value, the optimizer's lr) or null.
template <class P, class D>
json params_json(const D& d, const P& v, const std::optional<OptimizerConfig>& opt) {
  json p = json::object();
  for (const auto& spec : d.params) {
    json value = std::visit(
        [&](auto field) -> json {
          using F = std::remove_cvref_t<decltype(v.*field)>;
          if constexpr (std::is_same_v<F, std::optional<double>> || std::is_same_v<F, std::optional<std::int64_t>>) {
            return v.*field ? json(*(v.*field)) : json(nullptr);
          } else if constexpr (std::is_same_v<F, std::array<double, 2>>) {
            return json{(v.*field)[0], (v.*field)[1]};
          } else if constexpr (std::is_same_v<F, bool>) {
            return json(spec.fixed_note.empty() ? v.*field : d.defaults.*field);
          } else {
            return json(v.*field);
          }
        },
        spec.field);
    if (value.is_null() && spec.unset_shows == "optimizer.lr") {
      if (opt) value = opt->lr;
    } else if (value.is_null() && !spec.unset_shows.empty() && p.contains(spec.unset_shows)) {
      value = p[spec.unset_shows];
    }
    p[spec.key] = value;
  }
  return p;
}

json optimizer_json(const OptimizerConfig& o) {
  const OptimizerDescriptor* d = find_optimizer(o.type);
  if (!d) return json{{"type", o.type}, {"params", {{"lr", o.lr}, {"weight_decay", o.weight_decay}}}};  // built in code
  return json{{"type", d->display}, {"params", params_json(*d, o, std::nullopt)}};
}

json scheduler_json(const SchedulerConfig& s, const std::optional<OptimizerConfig>& opt) {
  const SchedulerDescriptor* d = find_scheduler(s.type);
  if (!d) return json{{"type", s.type}, {"params", json::object()}};
  return json{{"type", s.type}, {"params", params_json(*d, s, opt)}};
}

json batch_value(std::int64_t v) { return v > 0 ? json(v) : json(nullptr); }

// An offload section with the keys DeepSpeed's section of that name has.
json offload_json(const OffloadConfig& o, bool optimizer) {
  json j = {{"device", o.device},
            {"nvme_path", o.nvme_path.empty() ? json(nullptr) : json(o.nvme_path)},
            {"buffer_count", o.buffer_count},
            {"pin_memory", o.pin_memory}};
  if (optimizer) {
    j["pipeline_read"] = o.pipeline_read;
    j["pipeline_write"] = o.pipeline_write;
    j["fast_init"] = o.fast_init;
    j["ratio"] = o.ratio;
  } else {
    j["buffer_size"] = o.buffer_size;
    j["max_in_cpu"] = o.max_in_cpu;
  }
  return j;
}

json fp16_json(const Fp16Config& f) {
  return {{"enabled", f.enabled},
          {"auto_cast", f.auto_cast},
          {"loss_scale", f.loss_scale},
          {"initial_scale_power", f.initial_scale_power},
          {"loss_scale_window", f.loss_scale_window},
          {"hysteresis", f.hysteresis},
          {"consecutive_hysteresis", f.consecutive_hysteresis},
          {"min_loss_scale", f.min_loss_scale}};
}

json zero_json(const ZeroConfig& z) {
  return {{"stage", z.stage},
          {"contiguous_gradients", z.contiguous_gradients},
          {"reduce_scatter", z.reduce_scatter},
          {"reduce_bucket_size", z.reduce_bucket_size},
          {"allgather_bucket_size", z.allgather_bucket_size},
          {"allgather_partitions", z.allgather_partitions},
          // As given (null: DeepSpeed's stage == 3), so that re-reading the
          // resolved file does not warn about a false nobody wrote.
          {"overlap_comm", z.overlap_comm ? json(*z.overlap_comm) : json(nullptr)},
          // Stage 3, under DeepSpeed's documented stage3_ names.
          {"stage3_prefetch_bucket_size", z.prefetch_bucket_size},
          {"stage3_param_persistence_threshold", z.param_persistence_threshold},
          {"stage3_model_persistence_threshold", z.model_persistence_threshold},
          {"stage3_max_live_parameters", z.max_live_parameters},
          {"stage3_max_reuse_distance", z.max_reuse_distance},
          {"stage3_gather_16bit_weights_on_model_save", z.gather_16bit_weights_on_model_save},
          {"sub_group_size", z.sub_group_size},
          {"offload_optimizer", offload_json(z.offload_optimizer, true)},
          {"offload_param", offload_json(z.offload_param, false)}};
}

// Under DeepSpeed's current name of thread_count.
json aio_json(const AioConfig& a) {
  return {{"block_size", a.block_size},         {"queue_depth", a.queue_depth},
          {"intra_op_parallelism", a.thread_count}, {"single_submit", a.single_submit},
          {"overlap_events", a.overlap_events}, {"use_gds", a.use_gds}};
}

// The top-level values of a step; unset dtypes resolve as DeepSpeed resolves them.
void add_step_keys(const DsConfig& cfg, json& j) {
  j["gradient_clipping"] = cfg.gradient_clipping;
  j["steps_per_print"] = cfg.steps_per_print ? json(*cfg.steps_per_print) : json(nullptr);
  j["wall_clock_breakdown"] = cfg.wall_clock_breakdown;
  j["prescale_gradients"] = cfg.prescale_gradients;
  j["gradient_predivide_factor"] = cfg.gradient_predivide_factor;
  const char* training_dtype = cfg.fp16.enabled ? "fp16" : cfg.bf16.enabled ? "bf16" : "fp32";
  // None resolves to the training dtype, as DeepSpeed does.
  j["communication_data_type"] = cfg.communication_data_type.value_or(training_dtype);
  // None resolves to the working dtype, as DeepSpeed does.
  j["data_types"] = {{"grad_accum_dtype", cfg.data_types.grad_accum_dtype.value_or(training_dtype)}};
  j["dataloader_drop_last"] = cfg.dataloader_drop_last;
}

// The monitors, and the sections written only when enabled.
void add_monitor_sections(const DsConfig& cfg, json& j) {
  for (const auto& [name, m] : {std::pair<const char*, const MonitorConfig&>{"csv_monitor", cfg.csv_monitor},
                                {"tensorboard", cfg.tensorboard}})
    j[name] = {{"enabled", m.enabled}, {"output_path", m.output_path}, {"job_name", m.job_name}};
  if (const auto& f = cfg.flops_profiler; f.enabled)
    j["flops_profiler"] = {{"enabled", true}, {"profile_step", f.profile_step}, {"module_depth", f.module_depth},
                           {"top_modules", f.top_modules}, {"detailed", f.detailed},
                           {"output_file", f.output_file ? json(*f.output_file) : json(nullptr)}};
  if (const auto& l = cfg.comms_logger; l.enabled)
    j["comms_logger"] = {{"enabled", true}, {"verbose", l.verbose}, {"prof_all", l.prof_all},
                         {"prof_ops", l.prof_ops}, {"debug", l.debug}};
  // Only when given: the section's presence is what turns recomputation on.
  if (const auto& a = cfg.activation_checkpointing; a.enabled)
    j["activation_checkpointing"] = {{"partition_activations", a.partition_activations},
                                     {"cpu_checkpointing", a.cpu_checkpointing},
                                     {"contiguous_memory_optimization", a.contiguous_memory_optimization},
                                     {"number_checkpoints", a.number_checkpoints ? json(*a.number_checkpoints) : json(nullptr)},
                                     {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
                                     {"profile", a.profile}};
}

}  // namespace

nlohmann::json to_json(const DsConfig& cfg) {
  json j = json::object();
  j["train_batch_size"] = batch_value(cfg.train_batch_size);
  j["train_micro_batch_size_per_gpu"] = batch_value(cfg.train_micro_batch_size_per_gpu);
  j["gradient_accumulation_steps"] = batch_value(cfg.gradient_accumulation_steps);
  j["optimizer"] = cfg.optimizer ? optimizer_json(*cfg.optimizer) : json(nullptr);
  j["scheduler"] = cfg.scheduler ? scheduler_json(*cfg.scheduler, cfg.optimizer) : json(nullptr);
  j["fp16"] = fp16_json(cfg.fp16);
  j["bf16"] = {{"enabled", cfg.bf16.enabled}, {"check_grad_overflow", cfg.bf16.check_grad_overflow}};
  j["zero_optimization"] = zero_json(cfg.zero_optimization);
  add_step_keys(cfg, j);
  j["checkpoint"] = {{"tag_validation", cfg.checkpoint.tag_validation},
                     {"async_save", cfg.checkpoint.async_save},
                     {"io_threads", cfg.checkpoint.io_threads}};
  j["communication"] = {{"timeout", cfg.comms_config.timeout},
                        {"shared_memory", cfg.communication.shared_memory},
                        {"progress_thread", cfg.communication.progress_thread},
                        {"device_backend", cfg.communication.device_backend}};
  j["kernels"] = {{"attention", cfg.kernels.attention},
                  {"attention_block", cfg.kernels.attention_block},
                  {"cpu_bf16_gemm", cfg.kernels.cpu_bf16_gemm}};
  j["pipeline"] = pipeline_to_json(cfg.pipeline);
  j["aio"] = aio_json(cfg.aio);
  add_monitor_sections(cfg, j);
  j["seed"] = cfg.seed ? json(*cfg.seed) : json(nullptr);
  if (cfg.raw.is_object() && cfg.raw.contains("model")) j["model"] = cfg.raw["model"];
  return j;
}

}  // namespace ds::config
