// DeepSpeed's LR schedulers, formula for formula (runtime/lr_schedules.py at 0.19.6).
#include "ds/sched/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ds/core/error.h"
#include "ds/core/log.h"

namespace ds::sched {
namespace {

// Shared bookkeeping: `it` and the values computed for it.
class Base : public LrScheduler {
 public:
  double lr() const override { return lr_; }
  std::optional<std::array<double, 2>> betas() const override { return betas_; }
  void step() override { ++it_; compute(); }
  std::int64_t last_batch_iteration() const override { return it_; }
  void set_last_batch_iteration(std::int64_t it) override {
    DS_CHECK(it >= -1, "scheduler state: last_batch_iteration must be >= -1, got " << it);
    it_ = it;
    compute();
  }

 protected:
  virtual void compute() = 0;  // sets lr_ (and betas_) for it_
  std::int64_t it_ = -1;
  double lr_ = 0.0;
  std::optional<std::array<double, 2>> betas_;
};

class ConstantLr final : public Base {
 public:
  explicit ConstantLr(double lr) { lr_ = lr; }
  std::string_view name() const override { return "constant"; }
 private:
  void compute() override {}
};

bool is_log_warmup(const std::string& type) {
  if (type == "log") return true;
  if (type == "linear") return false;
  DS_WARN("scheduler.params.warmup_type: unknown warmup_type \"" << type << "\"; using log (as DeepSpeed)");
  return true;
}

std::int64_t checked_warmup_steps(std::int64_t n) {
  DS_CHECK(n > 0, "scheduler.params.warmup_num_steps must be a positive integer, got " << n);
  return std::max<std::int64_t>(2, n);  // DeepSpeed: max(2, warmup_num_steps)
}

// gamma of the warmup phase (it < N): ln(it+1)/ln(N) (log) or it/N (linear).
double warmup_gamma(std::int64_t it, std::int64_t n, bool log) {
  if (log) return (1.0 / std::log(double(n))) * std::log(double(it + 1));
  return double(it) / double(n);
}

// WarmupLR and WarmupDecayLR (decay when total is set).
class WarmupLr : public Base {
 public:
  WarmupLr(double min_lr, double max_lr, std::int64_t n, bool log, std::optional<std::int64_t> total)
      : min_(min_lr), delta_(max_lr - min_lr), n_(n), log_(log), total_(total) { compute(); }
  std::string_view name() const override { return total_ ? "WarmupDecayLR" : "WarmupLR"; }

 private:
  void compute() override {
    if (it_ < 0) { lr_ = min_; return; }
    double gamma;
    if (it_ < n_) gamma = warmup_gamma(it_, n_, log_);
    else if (!total_) gamma = 1.0;
    else gamma = std::max(0.0, double(*total_ - it_) / std::max(1.0, double(*total_ - n_)));
    lr_ = min_ + delta_ * gamma;
  }
  double min_, delta_;
  std::int64_t n_;
  bool log_;
  std::optional<std::int64_t> total_;
};

class WarmupCosineLr final : public Base {
 public:
  WarmupCosineLr(double org_lr, std::int64_t total, double wmin, std::int64_t n, double cmin, bool log)
      : org_(org_lr), total_(total), wmin_(wmin), n_(n), cmin_(cmin), log_(log) { compute(); }
  std::string_view name() const override { return "WarmupCosineLR"; }

 private:
  void compute() override {
    double ratio;
    if (it_ < 0) {
      ratio = 0.0;
    } else if (it_ < n_) {
      ratio = wmin_ + (1.0 - wmin_) * warmup_gamma(it_, n_, log_);
    } else {
      const double p = std::min(1.0, double(it_ - n_ + 1) / std::max(1.0, double(total_ - n_)));
      ratio = std::max(0.0, cmin_ + (1.0 - cmin_) * (1.0 + std::cos(std::numbers::pi * p)) / 2.0);
    }
    lr_ = org_ * ratio;
  }
  double org_;
  std::int64_t total_;
  double wmin_;
  std::int64_t n_;
  double cmin_;
  bool log_;
};

class OneCycle final : public Base {
 public:
  explicit OneCycle(const SchedulerParams& c) : c_(c) {
    first_ = double(c.cycle_first_step_size);
    second_ = c.cycle_second_step_size ? double(*c.cycle_second_step_size) : first_;
    total_ = first_ + second_;
    ratio_ = first_ / total_;
    first_stairs_ = c.cycle_first_stair_count;
    second_stairs_ = c.cycle_second_stair_count.value_or(c.cycle_first_stair_count);  // None -> first
    skip_lr_decay_ = c.decay_step_size == 0 || c.decay_lr_rate == 0.0;
    skip_mom_decay_ = c.decay_step_size == 0 || c.decay_mom_rate == 0.0;
    compute();
  }
  std::string_view name() const override { return "OneCycle"; }

 private:
  double scale_factor() const {
    const double bi = double(it_ + 1);  // DeepSpeed uses last_batch_iteration + 1 here
    const double cycle = std::floor(1.0 + bi / total_);
    const double x = 1.0 + bi / total_ - cycle;
    const bool first_half = x <= ratio_;
    const std::int64_t stairs = first_half ? first_stairs_ : second_stairs_;
    if (stairs <= 0) return first_half ? x / ratio_ : (x - 1.0) / (ratio_ - 1.0);  // continuous
    // A stair count holds lr/mom flat for step_size/count batches of its half. DeepSpeed
    // floors the integer batch offset within the cycle, not the float scale above: that one
    // can land 1e-16 under an exact stair (the peak of an asymmetric cycle) and floor a whole
    // stair lower. The count is picked by x as above, the half of the offset by the offset,
    // both as DeepSpeed does.
    const double b = std::fmod(bi, total_);
    const double position = b <= first_ ? b * double(stairs) / first_
                                        : (total_ - b) * double(stairs) / second_;
    return std::floor(position) / double(stairs);
  }
  void compute() override {
    if (it_ < 0) {  // construction: lr = min, betas = (min_mom, 0.99)
      lr_ = c_.cycle_min_lr;
      if (c_.cycle_momentum) betas_ = std::array<double, 2>{c_.cycle_min_mom, 0.99};
      return;
    }
    if (double(it_) < total_) {
      const double s = scale_factor();
      lr_ = c_.cycle_min_lr + (c_.cycle_max_lr - c_.cycle_min_lr) * s;
      if (c_.cycle_momentum) betas_ = std::array<double, 2>{c_.cycle_max_mom - (c_.cycle_max_mom - c_.cycle_min_mom) * s, 0.99};
      return;
    }
    const double d = double(it_) - total_ + 1.0;
    lr_ = skip_lr_decay_ ? c_.cycle_min_lr
                         : c_.cycle_min_lr / (1.0 + c_.decay_lr_rate * (d / double(c_.decay_step_size)));
    if (c_.cycle_momentum) {
      const double mom = skip_mom_decay_ ? c_.cycle_max_mom
                                         : c_.cycle_max_mom * (1.0 + c_.decay_mom_rate * (d / double(c_.decay_step_size)));
      betas_ = std::array<double, 2>{mom, 0.99};
    }
  }
  SchedulerParams c_;
  double first_ = 0, second_ = 0, total_ = 0, ratio_ = 0;
  std::int64_t first_stairs_ = 0, second_stairs_ = 0;  // 0: continuous
  bool skip_lr_decay_ = true, skip_mom_decay_ = true;
};

class LrRangeTest final : public Base {
 public:
  LrRangeTest(double min_lr, std::int64_t step_size, double rate, bool staircase)
      : min_(min_lr), size_(step_size), rate_(rate), stair_(staircase) { compute(); }
  std::string_view name() const override { return "LRRangeTest"; }

 private:
  void compute() override {
    const double x = double(it_ + 1) / double(size_);
    const double interval = stair_ ? std::floor(x) : x;
    lr_ = min_ * (1.0 + rate_ * interval);
  }
  double min_;
  std::int64_t size_;
  double rate_;
  bool stair_;
};

void check_finite(double v, const char* key) {
  DS_CHECK(std::isfinite(v), "scheduler.params." << key << " must be a finite number, got " << v);
}

}  // namespace

std::unique_ptr<LrScheduler> make_constant_scheduler(double optimizer_lr) {
  return std::make_unique<ConstantLr>(optimizer_lr);
}

std::unique_ptr<LrScheduler> make_scheduler(const SchedulerParams& c, double optimizer_lr,
                                            std::array<double, 2> /*optimizer_betas*/) {
  const std::string& t = c.type;
  if (t.empty()) return make_constant_scheduler(optimizer_lr);
  if (t == "WarmupLR" || t == "WarmupDecayLR") {
    const std::int64_t n = checked_warmup_steps(c.warmup_num_steps);
    check_finite(c.warmup_min_lr, "warmup_min_lr");
    std::optional<std::int64_t> total;
    // WarmupLR: warmup_max_lr None -> the optimizer's lr (DeepSpeed >= 0.17.2);
    // WarmupDecayLR keeps its own constructor default 0.001.
    double max_lr = c.warmup_max_lr.value_or(t == "WarmupLR" ? optimizer_lr : 0.001);
    check_finite(max_lr, "warmup_max_lr");
    if (t == "WarmupDecayLR") {
      DS_CHECK(c.total_num_steps.has_value(), "scheduler.params.total_num_steps is required for WarmupDecayLR");
      DS_CHECK(*c.total_num_steps > 0, "scheduler.params.total_num_steps must be a positive integer, got " << *c.total_num_steps);
      total = c.total_num_steps;
      if (*total < n) DS_WARN("scheduler.params.total_num_steps " << *total << " is less than warmup_num_steps " << n);
    }
    return std::make_unique<WarmupLr>(c.warmup_min_lr, max_lr, n, is_log_warmup(c.warmup_type), total);
  }
  if (t == "WarmupCosineLR") {
    DS_CHECK(c.total_num_steps.has_value(), "scheduler.params.total_num_steps is required for WarmupCosineLR");
    DS_CHECK(*c.total_num_steps > 0, "scheduler.params.total_num_steps must be a positive integer, got " << *c.total_num_steps);
    const std::int64_t n = checked_warmup_steps(c.warmup_num_steps);
    check_finite(c.warmup_min_ratio, "warmup_min_ratio");
    check_finite(c.cos_min_ratio, "cos_min_ratio");
    if (*c.total_num_steps < n)
      DS_WARN("scheduler.params.total_num_steps " << *c.total_num_steps << " is less than warmup_num_steps " << n);
    return std::make_unique<WarmupCosineLr>(optimizer_lr, *c.total_num_steps, c.warmup_min_ratio, n,
                                            c.cos_min_ratio, is_log_warmup(c.warmup_type));
  }
  if (t == "OneCycle") {
    DS_CHECK(c.cycle_first_step_size > 0,
             "scheduler.params.cycle_first_step_size must be a positive integer, got " << c.cycle_first_step_size);
    DS_CHECK(!c.cycle_second_step_size || *c.cycle_second_step_size > 0,
             "scheduler.params.cycle_second_step_size must be a positive integer, got " << *c.cycle_second_step_size);
    DS_CHECK(c.decay_step_size >= 0, "scheduler.params.decay_step_size must be >= 0, got " << c.decay_step_size);
    DS_CHECK(c.cycle_first_stair_count >= 0,
             "scheduler.params.cycle_first_stair_count must be >= 0, got " << c.cycle_first_stair_count);
    DS_CHECK(!c.cycle_second_stair_count || *c.cycle_second_stair_count >= 0,
             "scheduler.params.cycle_second_stair_count must be >= 0, got " << *c.cycle_second_stair_count);
    check_finite(c.cycle_min_lr, "cycle_min_lr");
    check_finite(c.cycle_max_lr, "cycle_max_lr");
    check_finite(c.cycle_min_mom, "cycle_min_mom");
    check_finite(c.cycle_max_mom, "cycle_max_mom");
    return std::make_unique<OneCycle>(c);
  }
  if (t == "LRRangeTest") {
    DS_CHECK(c.lr_range_test_step_size > 0,
             "scheduler.params.lr_range_test_step_size must be a positive integer, got " << c.lr_range_test_step_size);
    check_finite(c.lr_range_test_min_lr, "lr_range_test_min_lr");
    check_finite(c.lr_range_test_step_rate, "lr_range_test_step_rate");
    return std::make_unique<LrRangeTest>(c.lr_range_test_min_lr, c.lr_range_test_step_size,
                                         c.lr_range_test_step_rate, c.lr_range_test_staircase);
  }
  DS_THROW("scheduler.type \"" << t << "\" is not supported; use one of WarmupLR, WarmupDecayLR, "
           "WarmupCosineLR, OneCycle, LRRangeTest (or remove the scheduler section for a constant lr)");
}

}  // namespace ds::sched
