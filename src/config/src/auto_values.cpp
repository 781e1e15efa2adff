// "auto" values (the Hugging Face Trainer's placeholders) in a ds_config: filled from what the
// job knows and reported, or refused naming the key -- never a silent default for a learning
// rate or a precision. See ds/config/parse.h (fill_auto_values).
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/error.h"

namespace ds::config {

namespace {

bool is_batch_key(const std::string& path) {
  return path == "train_batch_size" || path == "train_micro_batch_size_per_gpu" ||
         path == "gradient_accumulation_steps";
}

bool is_precision_key(const std::string& path) {
  return path == "fp16.enabled" || path == "bf16.enabled" || path == "bfloat16.enabled";
}

// The resolved value at path as to_json writes it ("bfloat16" is written as "bf16").
std::string value_at(const nlohmann::json& resolved, std::string path) {
  if (path.rfind("bfloat16.", 0) == 0) path = "bf16." + path.substr(9);
  std::string pointer;
  for (char c : path) pointer += c == '.' ? '/' : c;
  const nlohmann::json::json_pointer ptr("/" + pointer);
  if (!resolved.contains(ptr)) return "dstrain's default";
  return resolved.at(ptr).dump();
}

[[noreturn]] void refuse(const AutoValue& a, const std::string& what_to_write) {
  DS_THROW(a.where << ": " << a.path << ": \"auto\" is a placeholder the Hugging Face Trainer fills from its own "
                   "arguments before DeepSpeed reads the config; " << what_to_write);
}

// Fills the value a (whose key needs the job's knowledge) or refuses it; returns the reason
// shown with the filled value.
std::string fill_one(DsConfig& cfg, const AutoValue& a, const KnownValues& known) {
  if (is_batch_key(a.path)) return "from the batch arithmetic";
  if (is_precision_key(a.path))
    refuse(a, "write true or false (dstrain does not choose a precision for you)");
  if (a.path == "optimizer.params.lr") {
    if (!known.lr) refuse(a, "write a number, or pass " + known.lr_flag);
    cfg.optimizer->lr = *known.lr;
    return "from " + known.lr_flag;
  }
  if (a.path == "scheduler.params.total_num_steps") {
    if (!known.total_steps) refuse(a, "write a number, or pass " + known.steps_flag);
    cfg.scheduler->total_num_steps = *known.total_steps;
    return "from " + known.steps_flag;
  }
  if (a.path == "scheduler.params.warmup_max_lr") {
    // As the HF Trainer does: the peak of the warmup is the learning rate (None: the
    // client optimizer's lr).
    if (cfg.optimizer) cfg.scheduler->warmup_max_lr = cfg.optimizer->lr;
    else cfg.scheduler->warmup_max_lr.reset();
    return "the optimizer's learning rate";
  }
  return "dstrain's default, which is DeepSpeed's";
}

}  // namespace

std::vector<std::string> fill_auto_values(DsConfig& cfg, const KnownValues& known) {
  // Taken out, so that a second call (the engine after the train app) finds nothing to do.
  const std::vector<AutoValue> autos = std::move(cfg.auto_values);
  cfg.auto_values.clear();
  std::vector<std::string> why(autos.size());
  // The learning rate first: warmup_max_lr's "auto" follows it.
  for (int pass = 0; pass < 2; ++pass)
    for (std::size_t i = 0; i < autos.size(); ++i)
      if ((autos[i].path == "scheduler.params.warmup_max_lr") == (pass == 1)) why[i] = fill_one(cfg, autos[i], known);
  const nlohmann::json resolved = to_json(cfg);
  std::vector<std::string> lines;
  for (std::size_t i = 0; i < autos.size(); ++i)
    lines.push_back(autos[i].where + ": " + autos[i].path + ": \"auto\" -> " + value_at(resolved, autos[i].path) +
                    " (" + why[i] + ")");
  return lines;
}

}  // namespace ds::config
