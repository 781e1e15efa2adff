// What rank 0 of `train` prints while it runs: a progress bar on a terminal, or one
// key=value line every steps_per_print steps otherwise; validation lines; the closing
// summary; and (--loss_csv) one CSV row per optimizer step.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include "ds/core/timer.h"

namespace ds::train {

struct StepRecord {
  std::int64_t step = 0;  // global step after this update (1-based)
  double loss = 0;        // mean over ranks and micro-batches
  double lr = 0;
  double grad_norm = 0;
  double loss_scale = 1;
  std::optional<double> val_loss;
};

class Reporter {
 public:
  // `enabled` is false on ranks other than 0 (every call is then a no-op). `bar` picks the
  // progress bar. `engine_print_every` is the config's steps_per_print: when set, the engine
  // prints the progress lines and the reporter adds only validation lines; when not, the
  // reporter prints about ten step lines a run.
  Reporter(bool enabled, bool bar, std::int64_t first_step, std::int64_t last_step,
           std::int64_t tokens_per_step, std::optional<std::int64_t> engine_print_every,
           const std::string& csv_path);
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // What the throughput counts (tokens_per_step's unit): "tokens" (the default) or "samples".
  void set_unit(std::string unit) { unit_ = std::move(unit); }
  void step(const StepRecord& r);
  // A plain line that must not be torn by the bar (checkpoints saved, warnings).
  void note(const std::string& line);
  void finish_bar();

  std::int64_t steps_done() const { return steps_done_; }
  double elapsed_s() const { return clock_.elapsed_s(); }
  // Throughput over the steps after the first (the first pays for page faults and warm-up).
  double tokens_per_s() const;
  std::optional<double> last_loss() const { return last_loss_; }
  std::optional<double> last_val_loss() const { return last_val_; }

 private:
  void draw_bar(bool force);

  bool enabled_, bar_;
  std::int64_t first_step_, last_step_, tokens_per_step_;
  std::int64_t print_every_;
  bool engine_prints_ = false;
  std::FILE* csv_ = nullptr;
  Stopwatch clock_;
  double first_step_end_s_ = -1, last_step_end_s_ = 0, last_draw_s_ = -1;
  std::int64_t steps_done_ = 0, current_step_ = 0;
  std::optional<double> last_loss_, last_val_;
  double last_lr_ = 0;
  bool bar_open_ = false;
  std::string unit_ = "tokens";
};

// "1:05" / "1:02:03".
std::string format_duration(double seconds);
// Bytes as readable text: printable ASCII and newlines kept, other bytes as '?'.
std::string printable(const std::string& bytes);

}  // namespace ds::train
