// The fully resolved config as JSON, with DeepSpeed's key names, so that the output is itself
// a valid ds_config.json that parses back to the same config (tests check the round trip).
#include "ds/config/parse.h"

namespace ds::config {

namespace {

using nlohmann::json;

// The spelling DeepSpeed accepts (its own names are case-insensitive; "SGD" is torch's).
const char* optimizer_name(const std::string& type) {
  if (type == "adam") return "Adam";
  if (type == "adamw") return "AdamW";
  if (type == "sgd") return "SGD";
  if (type == "lamb") return "Lamb";
  if (type == "adagrad") return "Adagrad";
  return type.c_str();
}

json optimizer_json(const OptimizerConfig& o) {
  json p = json::object();
  p["lr"] = o.lr;
  p["weight_decay"] = o.weight_decay;
  if (o.type == "adam" || o.type == "adamw") {
    p["betas"] = {o.betas[0], o.betas[1]};
    p["eps"] = o.eps;
    p["bias_correction"] = o.bias_correction;
    p["adam_w_mode"] = o.type == "adamw" ? true : o.adam_w_mode;
  } else if (o.type == "lamb") {
    p["betas"] = {o.betas[0], o.betas[1]};
    p["eps"] = o.eps;
    p["bias_correction"] = o.bias_correction;
    p["eps_inside_sqrt"] = o.eps_inside_sqrt;
    p["max_coeff"] = o.max_coeff;
    p["min_coeff"] = o.min_coeff;
  } else if (o.type == "sgd") {
    p["momentum"] = o.momentum;
    p["dampening"] = o.dampening;
    p["nesterov"] = o.nesterov;
  } else if (o.type == "adagrad") {
    p["eps"] = o.eps;
    p["lr_decay"] = o.lr_decay;
    p["initial_accumulator_value"] = o.initial_accumulator_value;
  }
  return json{{"type", optimizer_name(o.type)}, {"params", p}};
}

json scheduler_json(const SchedulerConfig& s, const std::optional<OptimizerConfig>& opt) {
  json p = json::object();
  auto warmup = [&] {
    p["warmup_num_steps"] = s.warmup_num_steps;
    p["warmup_type"] = s.warmup_type;
  };
  if (s.type == "WarmupLR" || s.type == "WarmupDecayLR") {
    p["warmup_min_lr"] = s.warmup_min_lr;
    // None means "the optimizer's lr": show that value when the config names the optimizer.
    if (s.warmup_max_lr) p["warmup_max_lr"] = *s.warmup_max_lr;
    else if (opt) p["warmup_max_lr"] = opt->lr;
    else p["warmup_max_lr"] = nullptr;
    warmup();
    if (s.type == "WarmupDecayLR") p["total_num_steps"] = s.total_num_steps ? json(*s.total_num_steps) : json(nullptr);
  } else if (s.type == "WarmupCosineLR") {
    p["total_num_steps"] = s.total_num_steps ? json(*s.total_num_steps) : json(nullptr);
    p["warmup_min_ratio"] = s.warmup_min_ratio;
    p["cos_min_ratio"] = s.cos_min_ratio;
    warmup();
  } else if (s.type == "OneCycle") {
    p["cycle_min_lr"] = s.cycle_min_lr;
    p["cycle_max_lr"] = s.cycle_max_lr;
    p["decay_lr_rate"] = s.decay_lr_rate;
    p["cycle_first_step_size"] = s.cycle_first_step_size;
    p["cycle_second_step_size"] = s.cycle_second_step_size.value_or(s.cycle_first_step_size);
    p["cycle_first_stair_count"] = s.cycle_first_stair_count;
    p["cycle_second_stair_count"] = s.cycle_second_stair_count.value_or(s.cycle_first_stair_count);
    p["decay_step_size"] = s.decay_step_size;
    p["cycle_momentum"] = s.cycle_momentum;
    p["cycle_min_mom"] = s.cycle_min_mom;
    p["cycle_max_mom"] = s.cycle_max_mom;
    p["decay_mom_rate"] = s.decay_mom_rate;
  } else if (s.type == "LRRangeTest") {
    p["lr_range_test_min_lr"] = s.lr_range_test_min_lr;
    p["lr_range_test_step_size"] = s.lr_range_test_step_size;
    p["lr_range_test_step_rate"] = s.lr_range_test_step_rate;
    p["lr_range_test_staircase"] = s.lr_range_test_staircase;
  }
  return json{{"type", s.type}, {"params", p}};
}

json batch_value(std::int64_t v) { return v > 0 ? json(v) : json(nullptr); }

}  // namespace

nlohmann::json to_json(const DsConfig& cfg) {
  json j = json::object();
  j["train_batch_size"] = batch_value(cfg.train_batch_size);
  j["train_micro_batch_size_per_gpu"] = batch_value(cfg.train_micro_batch_size_per_gpu);
  j["gradient_accumulation_steps"] = batch_value(cfg.gradient_accumulation_steps);
  j["optimizer"] = cfg.optimizer ? optimizer_json(*cfg.optimizer) : json(nullptr);
  j["scheduler"] = cfg.scheduler ? scheduler_json(*cfg.scheduler, cfg.optimizer) : json(nullptr);

  const auto& f = cfg.fp16;
  j["fp16"] = {{"enabled", f.enabled},
               {"auto_cast", f.auto_cast},
               {"loss_scale", f.loss_scale},
               {"initial_scale_power", f.initial_scale_power},
               {"loss_scale_window", f.loss_scale_window},
               {"hysteresis", f.hysteresis},
               {"consecutive_hysteresis", f.consecutive_hysteresis},
               {"min_loss_scale", f.min_loss_scale}};
  j["bf16"] = {{"enabled", cfg.bf16.enabled}, {"check_grad_overflow", cfg.bf16.check_grad_overflow}};
  const auto& z = cfg.zero_optimization;
  j["zero_optimization"] = {{"stage", z.stage},
                            {"contiguous_gradients", z.contiguous_gradients},
                            {"reduce_scatter", z.reduce_scatter},
                            {"reduce_bucket_size", z.reduce_bucket_size},
                            {"allgather_bucket_size", z.allgather_bucket_size},
                            {"allgather_partitions", z.allgather_partitions},
                            // As given (null: DeepSpeed's stage == 3), so that re-reading the
                            // resolved file does not warn about a false nobody wrote.
                            {"overlap_comm", z.overlap_comm ? json(*z.overlap_comm) : json(nullptr)}};
  j["gradient_clipping"] = cfg.gradient_clipping;
  j["steps_per_print"] = cfg.steps_per_print ? json(*cfg.steps_per_print) : json(nullptr);
  j["wall_clock_breakdown"] = cfg.wall_clock_breakdown;
  j["prescale_gradients"] = cfg.prescale_gradients;
  j["gradient_predivide_factor"] = cfg.gradient_predivide_factor;
  // None resolves to the training dtype, as DeepSpeed does.
  j["communication_data_type"] = cfg.communication_data_type.value_or(
      cfg.fp16.enabled ? "fp16" : cfg.bf16.enabled ? "bf16" : "fp32");
  // None resolves to the working dtype, as DeepSpeed does.
  j["data_types"] = {{"grad_accum_dtype", cfg.data_types.grad_accum_dtype.value_or(
                                              cfg.fp16.enabled ? "fp16" : cfg.bf16.enabled ? "bf16" : "fp32")}};
  j["dataloader_drop_last"] = cfg.dataloader_drop_last;
  j["checkpoint"] = {{"tag_validation", cfg.checkpoint.tag_validation},
                     {"async_save", cfg.checkpoint.async_save},
                     {"io_threads", cfg.checkpoint.io_threads}};
  j["comms_config"] = {{"timeout", cfg.comms_config.timeout}};
  j["communication"] = {{"shared_memory", cfg.communication.shared_memory},
                        {"progress_thread", cfg.communication.progress_thread}};
  j["kernels"] = {{"attention", cfg.kernels.attention},
                  {"attention_block", cfg.kernels.attention_block},
                  {"cpu_bf16_gemm", cfg.kernels.cpu_bf16_gemm}};
  j["csv_monitor"] = {{"enabled", cfg.csv_monitor.enabled},
                      {"output_path", cfg.csv_monitor.output_path},
                      {"job_name", cfg.csv_monitor.job_name}};
  j["seed"] = cfg.seed ? json(*cfg.seed) : json(nullptr);
  if (cfg.raw.is_object() && cfg.raw.contains("model")) j["model"] = cfg.raw["model"];
  return j;
}

}  // namespace ds::config
