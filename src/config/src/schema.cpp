// The parser's key tables: where each section's keys live (to point a misplaced key at its
// section), and every key path the parser accepts (the docs check).
#include <algorithm>

#include "reader.h"
#include "schema.h"

namespace ds::config {

namespace detail {

namespace {

using Table = std::vector<std::pair<std::string, std::vector<std::string>>>;

// optimizer.params and scheduler.params: every key of every descriptor's schema.
template <class Registry>
std::vector<std::string> params_keys(const Registry& registry) {
  std::vector<std::string> keys;
  for (const auto& d : registry)
    for (const auto& p : d.params)
      if (std::find(keys.begin(), keys.end(), p.key) == keys.end()) keys.push_back(p.key);
  return keys;
}

// Where the keys of the sections live, to point a misplaced key at its real section
// ("loss_scale" under bf16 belongs in fp16).
const Table& section_keys() {
  static const Table table = [] {
    Table t = {
      {"fp16", {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                "hysteresis", "consecutive_hysteresis", "min_loss_scale"}},
      {"bf16", {"enabled", "check_grad_overflow"}},
      {"zero_optimization", {"stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
                             "allgather_bucket_size", "allgather_partitions", "overlap_comm",
                             "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold",
                             "stage3_model_persistence_threshold", "stage3_max_live_parameters",
                             "stage3_max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
                             "sub_group_size", "offload_optimizer", "offload_param"}},
      {"checkpoint", {"tag_validation", "async_save", "io_threads"}},
      {"data_types", {"grad_accum_dtype"}},
      {"csv_monitor", {"enabled", "output_path", "job_name"}},
      {"tensorboard", {"enabled", "output_path", "job_name"}},
      {"flops_profiler", {"profile_step", "module_depth", "top_modules", "detailed", "output_file"}},
      {"communication", {"timeout", "shared_memory", "progress_thread", "device_backend"}},
      {"comms_logger", {"enabled", "verbose", "prof_all", "prof_ops", "debug"}},
      {"kernels", {"attention", "attention_block", "cpu_bf16_gemm"}},
      {"pipeline", {"stages", "partition_method", "activation_checkpoint_interval", "seed_layers",
                    "pipe_partitioned", "grad_partitioned", "use_reentrant"}},
      {"zero_optimization.offload_optimizer", {"device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read",
                                               "pipeline_write", "fast_init", "ratio"}},
      {"zero_optimization.offload_param", {"buffer_size", "max_in_cpu"}},
      {"aio", {"block_size", "queue_depth", "intra_op_parallelism", "single_submit", "overlap_events", "use_gds"}},
      {"activation_checkpointing", {"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                                    "number_checkpoints", "synchronize_checkpoint_boundary", "profile"}},
    };
    t.emplace_back("optimizer.params", params_keys(optimizer_registry()));
    t.emplace_back("scheduler.params", params_keys(scheduler_registry()));
    return t;
  }();
  return table;
}

}  // namespace

std::string section_of(const std::string& key, const std::string& except) {
  for (const auto& [section, keys] : section_keys()) {
    if (section == except) continue;
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) return section;
  }
  return {};
}

}  // namespace detail

std::string Range::text() const {
  auto num = [](double v) {
    if (std::floor(v) == v && std::abs(v) < 1e15) return std::to_string(static_cast<long long>(v));
    return nlohmann::json(v).dump();
  };
  const bool has_lo = lo != -kInf, has_hi = hi != kInf;
  if (has_lo && has_hi) {
    return "in " + std::string(lo_open ? "(" : "[") + num(lo) + ", " + num(hi) + (hi_open ? ")" : "]");
  }
  if (has_lo) return std::string(lo_open ? "> " : ">= ") + num(lo);
  if (has_hi) return std::string(hi_open ? "< " : "<= ") + num(hi);
  return "";
}

std::vector<std::string> config_keys() {
  // Each section registers its keys as it is read, given or not: read a document with every
  // section present, and one optimizer and scheduler section per descriptor.
  std::vector<std::string> keys;
  nlohmann::json doc = nlohmann::json::object();
  for (const char* section : {"fp16", "bf16", "bfloat16", "data_types", "checkpoint", "csv_monitor", "tensorboard", "flops_profiler", "comms_config",
                              "communication", "comms_logger", "kernels", "amp", "activation_checkpointing", "aio", "pipeline"})
    doc[section] = nlohmann::json::object();
  doc["zero_optimization"] = {{"offload_optimizer", nlohmann::json::object()},
                              {"offload_param", nlohmann::json::object()}};
  detail::parse_root(from_nlohmann(doc), "<keys>", nullptr, &keys);
  keys.push_back("elasticity.enabled");  // checked without a section reader (only false)
  for (const auto& d : optimizer_registry()) {
    const nlohmann::json o = {{"optimizer", {{"type", d.display}, {"params", nlohmann::json::object()}}}};
    detail::parse_root(from_nlohmann(o), "<keys>", nullptr, &keys);
  }
  for (const auto& d : scheduler_registry()) {
    nlohmann::json params = nlohmann::json::object();
    for (const auto& spec : d.params)
      if (spec.required) params[spec.key] = 1e6;  // any valid value
    const nlohmann::json o = {{"scheduler", {{"type", d.name}, {"params", params}}}};
    detail::parse_root(from_nlohmann(o), "<keys>", nullptr, &keys);
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

}  // namespace ds::config
