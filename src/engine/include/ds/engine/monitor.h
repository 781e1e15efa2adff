// csv_monitor: one CSV row per optimizer-step attempt (every accumulation boundary, skipped
// steps included), written by global rank 0 only.
//
// File (a contract, tests and tools read it): <output_path>/<job_name>/train.csv
// (output_path empty -> relative to the working directory, as DeepSpeed). Header:
//   step,samples,loss,lr,loss_scale,grad_norm,overflow,skipped_steps,step_time_ms
// step = global_steps after the boundary (1, 2, ...); samples = global_samples; loss = mean
// forward loss of the cycle over micro-batches and ranks; lr = the lr this step applied;
// loss_scale = the scale backward used; grad_norm = unscaled pre-clip global norm (-1 when
// inf/NaN); overflow = 1 when the step was skipped; step_time_ms = wall time since the
// previous boundary. Rows are appended (a resumed job continues the same file); the header
// is written only when the file is new or empty. Each row is flushed.
//
// tensorboard: TensorBoard event files (ds/io/tfevents.h) in <output_path>/<job_name>/, one
// new file per run, with DeepSpeed's tags and its x axis (global samples):
//   Train/Samples/train_loss, Train/Samples/lr, Train/Samples/loss_scale (fp16 only),
//   Train/Samples/samples_per_sec (dstrain's; the samples of the step over its wall time),
//   Train/Samples/eval_loss (the validation loss, when the caller reports one: Engine::log_eval_loss,
//   DeepSpeed's pipeline engine's tag).
// Events are flushed at every boundary (a crash loses at most the step being written).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "ds/config/ds_config.h"

namespace ds::io { class EventWriter; }

namespace ds::engine {

struct CsvRow {
  std::int64_t step = 0, samples = 0;
  double loss = 0, lr = 0, loss_scale = 1, grad_norm = 0;
  bool overflow = false;
  std::int64_t skipped_steps = 0;
  double step_time_ms = 0;
};

class CsvMonitor {
 public:
  static constexpr const char* kFileName = "train.csv";
  static constexpr const char* kHeader =
      "step,samples,loss,lr,loss_scale,grad_norm,overflow,skipped_steps,step_time_ms";
  // Creates the directory; throws ds::Error naming the path when it cannot be written.
  CsvMonitor(const std::string& output_path, const std::string& job_name);
  ~CsvMonitor();
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;
  void write(const CsvRow& row);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

class TensorBoardMonitor {
 public:
  // Throws ds::Error naming the directory when it cannot be written.
  TensorBoardMonitor(const std::string& output_path, const std::string& job_name, bool fp16);
  ~TensorBoardMonitor();
  void write(const CsvRow& row);
  void write_eval_loss(std::int64_t samples, double loss);
  const std::string& path() const;

 private:
  std::unique_ptr<io::EventWriter> events_;
  bool fp16_;
  std::int64_t last_samples_ = -1;  // samples at the previous row (-1: none yet)
};

// The monitors a config enables, for global rank 0 (others pass make = false): each row goes
// to every one of them.
class Monitors {
 public:
  Monitors(const config::DsConfig& cfg, bool make);
  ~Monitors();
  bool any() const { return csv_ || tb_; }
  void write(const CsvRow& row);
  // The validation loss at `samples`: TensorBoard only (train.csv's columns are per step).
  void write_eval_loss(std::int64_t samples, double loss);
  const CsvMonitor* csv() const { return csv_.get(); }
  const TensorBoardMonitor* tensorboard() const { return tb_.get(); }

 private:
  std::unique_ptr<CsvMonitor> csv_;
  std::unique_ptr<TensorBoardMonitor> tb_;
};

}  // namespace ds::engine
