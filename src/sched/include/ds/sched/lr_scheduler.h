// DeepSpeed's LR schedulers (runtime/lr_schedules.py): WarmupLR, WarmupDecayLR, WarmupCosineLR,
// OneCycle, LRRangeTest.
//
// Contract (as DeepSpeed): the iteration counter `it` (last_batch_iteration) starts at -1 and
// construction sets lr() to the value for it = -1. The engine calls step() once per
// SUCCESSFUL optimizer step, after that step (never on an overflow-skipped step), so the
// optimizer's k-th step (1-based) applies lr() for it = k - 2. Checkpoints store
// last_batch_iteration only.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

#include "ds/sched/params.h"

namespace ds::sched {

class LrScheduler {
 public:
  virtual ~LrScheduler() = default;
  // The lr the NEXT optimizer step applies.
  virtual double lr() const = 0;
  // OneCycle with cycle_momentum: (beta1, beta2) the next step applies; otherwise nullopt.
  // The engine passes them to Adam-family optimizers (those with betas), as DeepSpeed does.
  virtual std::optional<std::array<double, 2>> betas() const { return std::nullopt; }
  // it += 1 and recompute lr / betas. Once per successful optimizer step.
  virtual void step() = 0;
  virtual std::int64_t last_batch_iteration() const = 0;
  // Checkpoint restore: sets it and recomputes lr / betas for it (DeepSpeed's load_state_dict
  // sets it only; the next step() then writes lr(it+1) -- identical from then on).
  virtual void set_last_batch_iteration(std::int64_t it) = 0;
  virtual std::string_view name() const = 0;
};

// A constant lr (no scheduler section): lr() == optimizer_lr always; counts its steps.
std::unique_ptr<LrScheduler> make_constant_scheduler(double optimizer_lr);

// Builds cfg.type with DeepSpeed's formulas and defaults. optimizer_lr is the optimizer's lr
// (WarmupLR's default warmup_max_lr and WarmupCosineLR's base lr); optimizer_betas are
// unused by the formulas (OneCycle forces beta2 = 0.99, as DeepSpeed) but kept for symmetry.
// Invalid params throw ds::Error naming the key (scheduler.params.warmup_num_steps ...).
// An empty type gives the constant scheduler.
std::unique_ptr<LrScheduler> make_scheduler(const SchedulerParams& cfg, double optimizer_lr,
                                            std::array<double, 2> optimizer_betas);

}  // namespace ds::sched
