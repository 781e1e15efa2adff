// Every rule that spans keys (docs/user/config.md "Rules across keys"). Single keys are
// checked where they are read (types, ranges, names); what depends on two keys or on the
// world size is here, once, for the parser and for the engine.
//
// Two callers, two message forms kept from before the rules lived here: the parser's
// ("file:line:col: key: message", with DeepSpeed's wording) and the engine's, for a
// DsConfig built in code ("source: message").
#include "ds/config/validate.h"

#include <cstdint>
#include <string>
#include <utility>

#include "ds/config/parse.h"
#include "ds/config/registry.h"
#include "ds/core/error.h"
#include "validate_parsed.h"

namespace ds::config {

namespace {

std::string jquote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}
std::string num(double v) { return nlohmann::json(v).dump(); }

class Rules {
 public:
  Rules(const DsConfig& cfg, const detail::KeyPositions* positions) : c_(cfg), pos_(positions) {}

  // A rule broken. parsed: the parser's message after "where: key: "; plain: the message
  // after "source: " for a config that did not come from the parser.
  [[noreturn]] void fail(const std::string& key, const std::string& parsed, const std::string& plain) const {
    if (pos_) DS_THROW(where(key) << ": " << key << ": " << parsed);
    DS_THROW(c_.source << ": " << plain);
  }
  // A rule with one wording for both callers, the key named in the message itself.
  [[noreturn]] void fail_same(const std::string& key, const std::string& message) const {
    DS_THROW((pos_ ? where(key) : c_.source) << ": " << message);
  }
  // A rule only the parser had: the engine's form is "source: key: message" (the parser's
  // form for a document without positions).
  [[noreturn]] void fail_key(const std::string& key, const std::string& message) const {
    fail(key, message, key + ": " + message);
  }

  void run(std::optional<int> world_size) const;

 private:
  std::string where(const std::string& key) const {
    auto it = pos_->find(key);
    if (it == pos_->end() || !it->second.known()) return c_.source;
    return c_.source + ":" + std::to_string(it->second.line) + ":" + std::to_string(it->second.column);
  }
  // The parser reads bf16 under its legacy name "bfloat16" when "bf16" is absent.
  std::string bf16_path() const {
    if (pos_ && !pos_->count("bf16.enabled") && pos_->count("bfloat16.enabled")) return "bfloat16";
    return "bf16";
  }

  // Where `key` was written, else where `fallback` was (a missing key named beside the one
  // that requires it).
  std::string where_or(const std::string& key, const std::string& fallback) const {
    return pos_->count(key) ? where(key) : where(fallback);
  }
  // The key that turned the offload on, as written: the deprecated bool when it was used.
  std::string offload_device_key(const std::string& section, const std::string& deprecated) const {
    const std::string old = "zero_optimization." + deprecated, now = "zero_optimization." + section + ".device";
    return pos_ && pos_->count(old) && !pos_->count(now) ? old : now;
  }

  void precision() const;
  void zero() const;
  void offload(const std::string& section, const OffloadConfig& o, const std::string& deprecated) const;
  void batch(int world_size) const;
  void optimizer() const;
  void engine_limits() const;
  void monitor(const char* name, const MonitorConfig& m, const char* file) const;

  const DsConfig& c_;
  const detail::KeyPositions* pos_;
};

void Rules::precision() const {
  if (c_.fp16.enabled && c_.bf16.enabled) {
    const std::string b = bf16_path();
    fail(b + ".enabled",
         "fp16 and bf16 cannot both be enabled (DeepSpeed: \"bfloat16 and fp16 modes cannot be "
         "simultaneously enabled\"); set one of fp16.enabled, " + b + ".enabled to false",
         "fp16.enabled and bf16.enabled are both true; enable at most one");
  }
  const std::string working = c_.fp16.enabled ? "fp16" : c_.bf16.enabled ? "bf16" : "fp32";
  if (c_.data_types.grad_accum_dtype) {
    // The two accumulations there are: in the working dtype (the default) or in an fp32 buffer
    // beside it. The other half type (bf16 sums of fp16 gradients, or the reverse) loses range
    // or precision against both and DeepSpeed's optimizers do not offer it: an error listing
    // the supported values.
    const std::string& v = *c_.data_types.grad_accum_dtype;
    if (v != working && v != "fp32") {
      fail("data_types.grad_accum_dtype",
           jquote(v) + " is not supported with the " + working + " working dtype; supported: " +
               (working == "fp32" ? "\"fp32\"" : "\"fp32\" or \"" + working + "\" (the working dtype)"),
           "data_types.grad_accum_dtype '" + v + "' is not supported with the " + working +
               " working dtype; supported: fp32 or " + working);
    }
  }
  if (c_.communication_data_type) {
    const std::string& t = *c_.communication_data_type;
    if (t != "fp32" && t != "fp16" && t != "bf16") {
      fail("communication_data_type", "expected \"fp32\", \"fp16\" or \"bf16\", got " + jquote(t),
           "communication_data_type '" + t + "' is not one of fp32, fp16, bf16");
    }
  }
  if (c_.fp16.loss_scale == 0) {  // dynamic scaling: DeepSpeed's validators
    if (c_.fp16.loss_scale_window <= 0)
      fail_key("fp16.loss_scale_window", "must be > 0 with dynamic loss scaling (loss_scale 0)");
    if (!(c_.fp16.min_loss_scale > 0))
      fail_key("fp16.min_loss_scale", "must be > 0 with dynamic loss scaling (loss_scale 0)");
  }
}

void Rules::zero() const {
  const auto& z = c_.zero_optimization;
  if (z.stage < 0 || z.stage > 3) {
    fail_same("zero_optimization.stage", "zero_optimization.stage " + std::to_string(z.stage) +
                                             " is not supported (dstrain implements stages 0 to 3)");
  }
  if (z.reduce_bucket_size <= 0)
    fail_same("zero_optimization.reduce_bucket_size", "zero_optimization.reduce_bucket_size must be > 0");
  if (z.allgather_bucket_size <= 0)
    fail_same("zero_optimization.allgather_bucket_size", "zero_optimization.allgather_bucket_size must be > 0");
  // The stage-3 sizes (DeepSpeed: ge=0); the parser reads them in range, a config built in
  // code may not be.
  using Size = std::pair<const char*, std::int64_t>;
  for (const auto& [key, v] : {Size{"stage3_prefetch_bucket_size", z.prefetch_bucket_size},
                               Size{"stage3_param_persistence_threshold", z.param_persistence_threshold},
                               Size{"stage3_model_persistence_threshold", z.model_persistence_threshold},
                               Size{"stage3_max_live_parameters", z.max_live_parameters},
                               Size{"stage3_max_reuse_distance", z.max_reuse_distance},
                               Size{"sub_group_size", z.sub_group_size}}) {
    if (v < 0) {
      const std::string path = std::string("zero_optimization.") + key;
      fail_same(path, path + " must be >= 0, got " + std::to_string(v));
    }
  }
  if (!(c_.gradient_clipping >= 0))
    fail_same("gradient_clipping", "gradient_clipping must be >= 0, got " + num(c_.gradient_clipping));
  if (!(c_.gradient_predivide_factor > 0))
    fail_same("gradient_predivide_factor",
              "gradient_predivide_factor must be > 0, got " + num(c_.gradient_predivide_factor));
  if (z.stage == 2 && z.reduce_scatter) {
    if (c_.gradient_predivide_factor != 1.0) {
      fail_key("gradient_predivide_factor",
               "must be 1 with zero_optimization.stage 2 and reduce_scatter (DeepSpeed asserts this); "
               "set zero_optimization.reduce_scatter to false or remove gradient_predivide_factor");
    }
    if (c_.prescale_gradients) {
      fail_key("prescale_gradients",
               "cannot be true with zero_optimization.stage 2 and reduce_scatter (DeepSpeed asserts this); "
               "set zero_optimization.reduce_scatter to false");
    }
  }
}

// offload_optimizer at stages 1-3, offload_param at stage 3 (DeepSpeed ignores them at the
// other stages; dstrain refuses a setting that would do nothing), nvme with a path.
void Rules::offload(const std::string& section, const OffloadConfig& o, const std::string& deprecated) const {
  const std::string prefix = "zero_optimization." + section;
  if (o.device != "none" && o.device != "cpu" && o.device != "nvme") {
    fail_same(prefix + ".device", prefix + ".device " + jquote(o.device) + " is not one of \"none\", \"cpu\", \"nvme\"");
  }
  if (!o.enabled()) return;
  const int stage = c_.zero_optimization.stage;
  const bool param = section == "offload_param";
  if (param ? stage != 3 : stage < 1) {
    const std::string key = offload_device_key(section, deprecated);
    const std::string value = key.ends_with(".device") ? jquote(o.device) : "true";
    fail_same(key, key + " " + value + " needs zero_optimization.stage " + (param ? "3" : ">= 1") + " (stage is " +
                       std::to_string(stage) + "); " +
                       (param ? "parameters are offloaded only where ZeRO partitions them"
                              : "the optimizer state is offloaded only where ZeRO partitions it"));
  }
  if (o.nvme() && o.nvme_path.empty()) {
    const std::string key = prefix + ".nvme_path";
    const std::string message = key + " is required with device \"nvme\" (the directory of the swap files)";
    if (pos_) DS_THROW(where_or(key, prefix + ".device") << ": " << message);
    DS_THROW(c_.source << ": " << message);
  }
}

void Rules::batch(int world_size) const {
  if (c_.gradient_accumulation_steps < 1 || c_.train_micro_batch_size_per_gpu < 1) {
    fail_same("train_batch_size", "batch sizes did not resolve (gradient_accumulation_steps " +
                                      std::to_string(c_.gradient_accumulation_steps) +
                                      ", train_micro_batch_size_per_gpu " +
                                      std::to_string(c_.train_micro_batch_size_per_gpu) + ")");
  }
  DsConfig copy;  // resolving resolved sizes is a no-op; sizes that do not fit throw its message
  copy.source = c_.source;
  copy.train_batch_size = c_.train_batch_size;
  copy.train_micro_batch_size_per_gpu = c_.train_micro_batch_size_per_gpu;
  copy.gradient_accumulation_steps = c_.gradient_accumulation_steps;
  resolve_batch_sizes(copy, world_size);
}

// The optimizer's restrictions, from its descriptor (ds/config/registry.h).
void Rules::optimizer() const {
  // None: the engine's default, Adam.
  const OptimizerConfig o = c_.optimizer.value_or(OptimizerConfig{});
  const OptimizerDescriptor* d = find_optimizer(o.type);
  if (!d) return;  // make_optimizer names an unknown type
  if (!d->needs_dynamic_loss_scale.empty() && c_.fp16.loss_scale != 0) {
    fail("fp16.loss_scale",
         d->display + " requires dynamic loss scaling (DeepSpeed asserts it): set fp16.loss_scale to 0",
         "the " + d->display + " optimizer needs dynamic loss scaling with fp16 (" + d->needs_dynamic_loss_scale +
             "); remove fp16.loss_scale or set it to 0");
  }
  if (d->check) {
    if (auto broken = d->check(o)) fail_key("optimizer.params." + broken->first, broken->second);
  }
}

// What dstrain's engine does not implement, though DeepSpeed's format allows it: checked
// only when the config is about to be trained with.
void Rules::engine_limits() const {
  const OptimizerDescriptor* d = find_optimizer(c_.optimizer ? c_.optimizer->type : "adam");
  if (d && !d->zero_reason.empty() && c_.zero_optimization.stage != 0) {
    fail_same("zero_optimization.stage",
              "the " + d->display + " optimizer " + d->zero_reason + " and is not supported with ZeRO " +
                  "(zero_optimization.stage " + std::to_string(c_.zero_optimization.stage) +
                  "); use Adam/AdamW with ZeRO or stage 0 with " + d->display);
  }
}

// A monitor writes <output_path>/<job_name>/<file>: a job_name with a '/' or a ".." would put
// it (and create directories) outside output_path, an empty one or "." in it.
void Rules::monitor(const char* name, const MonitorConfig& m, const char* file) const {
  if (!m.enabled) return;
  const std::string& n = m.job_name;
  if (!n.empty() && n != "." && n != ".." && n.find_first_of(std::string("/\0", 2)) == std::string::npos) return;
  fail_key(std::string(name) + ".job_name",
           jquote(n) + " is not a single directory name (not empty, \".\" or \"..\", no '/'): the monitor writes "
               "<output_path>/<job_name>/" + file + ", and the directory must lie inside " + name + ".output_path");
}

void Rules::run(std::optional<int> world_size) const {
  precision();
  zero();
  offload("offload_optimizer", c_.zero_optimization.offload_optimizer, "cpu_offload");
  offload("offload_param", c_.zero_optimization.offload_param, "cpu_offload_param");
  optimizer();
  monitor("csv_monitor", c_.csv_monitor, "train.csv");
  monitor("tensorboard", c_.tensorboard, "events.out.tfevents.*");
  if (world_size) {
    batch(*world_size);
    engine_limits();
  }
}

}  // namespace

void validate(const DsConfig& cfg, std::optional<int> world_size) { Rules(cfg, nullptr).run(world_size); }

namespace detail {
void validate_parsed(const DsConfig& cfg, const KeyPositions& positions) {
  Rules(cfg, &positions).run(std::nullopt);
}
}  // namespace detail

}  // namespace ds::config
