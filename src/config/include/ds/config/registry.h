// The optimizers and LR schedulers a config may name, one descriptor each: the name and its
// spellings, every parameter (key, type, default, range), and the restrictions. The parser
// reads `params` from a descriptor's schema, to_json writes it back from the same schema, and
// validate() applies the restrictions, so an optimizer or scheduler is added in one place
// (docs/dev/architecture.md "Extension points").
//
// The defaults are the descriptor's `defaults` struct; what builds the object from the
// parameters is ds::optim::make_optimizer / ds::sched::make_scheduler, by `name`.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "ds/optim/params.h"
#include "ds/sched/params.h"

namespace ds::config {

// The values a number may take, and their wording for "expected a number ...".
struct Range {
  static constexpr double kInf = std::numeric_limits<double>::infinity();
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;
  bool contains(double v) const {
    if (std::isnan(v)) return false;
    if (lo_open ? !(v > lo) : !(v >= lo)) return false;
    if (hi_open ? !(v < hi) : !(v <= hi)) return false;
    return true;
  }
  std::string text() const;  // "", ">= 0", "> 0", "in [0, 1)"

  static Range any() { return {}; }
  static Range at_least(double v) { return Range{v, kInf, false, false}; }
  static Range above(double v) { return Range{v, kInf, true, false}; }
  static Range unit_open() { return Range{0.0, 1.0, false, true}; }  // [0, 1)
};

// One key of `params`. The field pointer's type is the value's type: a number, an integer
// (>= min), a bool, a pair of numbers in [0, 1) (betas), or a string from `choices`; the
// optional ones also take null, which means the descriptor's default.
template <class P>
struct Param {
  using Field = std::variant<double P::*, std::optional<double> P::*, std::int64_t P::*,
                             std::optional<std::int64_t> P::*, bool P::*, std::array<double, 2> P::*,
                             std::string P::*>;
  std::string key;
  Field field;
  Range range;                          // numbers
  std::int64_t min = 0;                   // integers
  std::vector<std::string> choices;  // strings; another value warns and uses the default
  bool required = false;                  // must be given (not absent, not "auto")
  // The value is fixed to the default whatever is written; writing another value warns with
  // this text (AdamW's adam_w_mode). Empty: the value is read.
  std::string fixed_note;
  // Optional values: what to_json writes when unset, after the field: another key's value, or
  // the optimizer's lr ("optimizer.lr"); empty: null.
  std::string unset_shows;
};

// A key accepted only at false (any other value is an error with `message`).
struct FalseOnly {
  std::string key, message;
};

struct OptimizerDescriptor {
  std::string name;      // OptimizerParams::type: the canonical, lower-case name ("adamw")
  std::string display;   // DeepSpeed's spelling, what to_json writes ("AdamW")
  // DeepSpeed lower-cases the names of its own optimizers; anything else is a torch.optim
  // lookup, case-sensitive (only `display` is accepted: "SGD", not "sgd").
  bool torch_name = false;
  optim::OptimizerParams defaults;    // type == name
  std::vector<Param<optim::OptimizerParams>> params;  // in reading order
  std::vector<FalseOnly> false_only;                  // "amsgrad", "maximize"
  std::vector<std::string> ignored;                   // accepted with no effect
  // Bools accepted and ignored with an info line: the key, and the line's text after
  // "<where>: optimizer.params.<key> ".
  std::vector<std::pair<std::string, std::string>> noted;
  // Restrictions. needs_dynamic_loss_scale: fp16.loss_scale must be 0 (the reason for the
  // engine's message); zero_reason non-empty: dstrain's engine runs it only at ZeRO stage 0.
  std::string needs_dynamic_loss_scale;
  std::string zero_reason;
  // A rule across its params: {key under optimizer.params, message} of the first broken.
  std::optional<std::pair<std::string, std::string>> (*check)(const optim::OptimizerParams&) = nullptr;
  // The state tensors it keeps, one fp32 value per parameter each, for the given params: the
  // optimizer library's one list (ds/optim/params.h), which Optimizer::state_names() returns
  // too. The engine's memory estimate reads it.
  std::vector<std::string> (*state)(const optim::OptimizerParams&) = &optim::optimizer_state_names;
};

struct SchedulerDescriptor {
  std::string name;  // SchedulerParams::type, exact spelling ("WarmupLR")
  sched::SchedulerParams defaults;  // type == name
  std::vector<Param<sched::SchedulerParams>> params;  // in reading order
  // The message for a missing required key (after "scheduler.params.<first required>: " when
  // there is no params object, after "scheduler.params: " otherwise). Empty: "is required
  // for <name>", named at the missing key.
  std::string required_message;
  // A warning about its params: {key under scheduler.params, message} when there is one.
  std::optional<std::pair<std::string, std::string>> (*warn)(const sched::SchedulerParams&) = nullptr;
};

// Every optimizer and scheduler, in the order error messages list them.
const std::vector<OptimizerDescriptor>& optimizer_registry();
const std::vector<SchedulerDescriptor>& scheduler_registry();
// By canonical name (OptimizerParams::type / SchedulerParams::type); nullptr when unknown.
const OptimizerDescriptor* find_optimizer(const std::string& name);
const SchedulerDescriptor* find_scheduler(const std::string& name);

}  // namespace ds::config
