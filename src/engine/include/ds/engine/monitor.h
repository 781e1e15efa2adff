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
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

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

}  // namespace ds::engine
