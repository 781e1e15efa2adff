// The parameters of one LR scheduler, as plain data: what make_scheduler() takes. The config
// library fills it from ds_config.json (its descriptors, ds/config/registry.h, name each
// field's key, default and range); this library never reads a config.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ds::sched {

struct SchedulerParams {
  // "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"; empty: none.
  std::string type;
  // WarmupLR / WarmupDecayLR
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;  // None -> the optimizer's lr
  std::int64_t warmup_num_steps = 1000;
  std::string warmup_type = "log";  // "log" | "linear"
  std::optional<std::int64_t> total_num_steps;  // required by WarmupDecayLR, WarmupCosineLR
  // WarmupCosineLR
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 1e-4;
  // OneCycle
  double cycle_min_lr = 0.0, cycle_max_lr = 0.0, decay_lr_rate = 0.0;
  std::int64_t cycle_first_step_size = 2000;
  std::optional<std::int64_t> cycle_second_step_size;  // None -> first
  std::int64_t cycle_first_stair_count = 0;
  std::optional<std::int64_t> cycle_second_stair_count;  // None -> first
  std::int64_t decay_step_size = 0;
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8, cycle_max_mom = 0.9, decay_mom_rate = 0.0;
  // LRRangeTest
  double lr_range_test_min_lr = 1e-3;
  std::int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

}  // namespace ds::sched

namespace ds::config {
// DsConfig::scheduler's type (ds/config/ds_config.h): the same struct under the config's name.
using SchedulerConfig = sched::SchedulerParams;
}  // namespace ds::config
