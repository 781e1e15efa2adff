// The LR scheduler descriptors (ds/config/registry.h): DeepSpeed's runtime/lr_schedules.py
// constructors, their parameters and defaults. Adding a scheduler: one entry here, its
// formula in src/sched (docs/dev/kernels.md "The maths").
#include "ds/config/registry.h"

// A Param entry names the members it sets; the others are value-initialized (no choices,
// no note). GCC warns about each omitted member of such a positional aggregate initializer.
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace ds::config {

namespace {

using P = sched::SchedulerParams;
using Spec = Param<P>;

P defaults_for(const char* name) {
  P p;
  p.type = name;
  return p;
}

const Spec kWarmupSteps{"warmup_num_steps", &P::warmup_num_steps, {}, 1};
const Spec kWarmupType{"warmup_type", &P::warmup_type, {}, 0, {"log", "linear"}};
const Spec kTotal{"total_num_steps", &P::total_num_steps, {}, 1, {}, true};

std::optional<std::pair<std::string, std::string>> total_below_warmup(const P& p) {
  if (p.total_num_steps && *p.total_num_steps < p.warmup_num_steps) {
    return {{"total_num_steps", "scheduler.params.total_num_steps " + std::to_string(*p.total_num_steps) +
                                    " is less than warmup_num_steps " + std::to_string(p.warmup_num_steps)}};
  }
  return std::nullopt;
}

SchedulerDescriptor warmup(const char* name) {
  SchedulerDescriptor d;
  d.name = name;
  d.defaults = defaults_for(name);
  Spec max_lr{"warmup_max_lr", &P::warmup_max_lr, Range::at_least(0)};
  max_lr.unset_shows = "optimizer.lr";  // None: the optimizer's lr
  d.params = {{"warmup_min_lr", &P::warmup_min_lr, Range::at_least(0)}, max_lr, kWarmupSteps, kWarmupType};
  if (d.name == "WarmupDecayLR") {
    d.defaults.warmup_max_lr = 1e-3;  // its constructor default, unlike WarmupLR's
    d.params.push_back(kTotal);
    d.warn = total_below_warmup;
  }
  return d;
}

SchedulerDescriptor cosine() {
  SchedulerDescriptor d;
  d.name = "WarmupCosineLR";
  d.defaults = defaults_for("WarmupCosineLR");
  d.params = {{"warmup_min_ratio", &P::warmup_min_ratio, Range::at_least(0)},
              {"cos_min_ratio", &P::cos_min_ratio, Range::at_least(0)}, kWarmupSteps, kWarmupType, kTotal};
  d.warn = total_below_warmup;
  return d;
}

SchedulerDescriptor one_cycle() {
  SchedulerDescriptor d;
  d.name = "OneCycle";
  d.defaults = defaults_for("OneCycle");
  Spec second_size{"cycle_second_step_size", &P::cycle_second_step_size, {}, 1};
  second_size.unset_shows = "cycle_first_step_size";  // None: the first half's
  Spec second_stairs{"cycle_second_stair_count", &P::cycle_second_stair_count, {}, 0};
  second_stairs.unset_shows = "cycle_first_stair_count";
  d.params = {{"cycle_min_lr", &P::cycle_min_lr, Range::at_least(0), 0, {}, true},
              {"cycle_max_lr", &P::cycle_max_lr, Range::at_least(0), 0, {}, true},
              {"decay_lr_rate", &P::decay_lr_rate, Range::at_least(0)},
              {"cycle_first_step_size", &P::cycle_first_step_size, {}, 1},
              second_size,
              {"cycle_first_stair_count", &P::cycle_first_stair_count, {}, 0},
              second_stairs,
              {"decay_step_size", &P::decay_step_size, {}, 0},
              {"cycle_momentum", &P::cycle_momentum},
              {"cycle_min_mom", &P::cycle_min_mom, Range::unit_open()},
              {"cycle_max_mom", &P::cycle_max_mom, Range::unit_open()},
              {"decay_mom_rate", &P::decay_mom_rate, Range::any()}};
  d.required_message = "cycle_min_lr and cycle_max_lr are required for OneCycle";
  return d;
}

SchedulerDescriptor range_test() {
  SchedulerDescriptor d;
  d.name = "LRRangeTest";
  d.defaults = defaults_for("LRRangeTest");
  d.params = {{"lr_range_test_min_lr", &P::lr_range_test_min_lr, Range::at_least(0)},
              {"lr_range_test_step_size", &P::lr_range_test_step_size, {}, 1},
              {"lr_range_test_step_rate", &P::lr_range_test_step_rate, Range::any()},
              {"lr_range_test_staircase", &P::lr_range_test_staircase}};
  return d;
}

}  // namespace

const std::vector<SchedulerDescriptor>& scheduler_registry() {
  static const std::vector<SchedulerDescriptor> all = {warmup("WarmupLR"), warmup("WarmupDecayLR"), cosine(),
                                                       one_cycle(), range_test()};
  return all;
}

const SchedulerDescriptor* find_scheduler(const std::string& name) {
  for (const auto& d : scheduler_registry())
    if (d.name == name) return &d;
  return nullptr;
}

}  // namespace ds::config
