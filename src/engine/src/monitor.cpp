#include "ds/engine/monitor.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "ds/core/error.h"
#include "ds/io/tfevents.h"

namespace ds::engine {

CsvMonitor::CsvMonitor(const std::string& output_path, const std::string& job_name) {
  namespace fs = std::filesystem;
  fs::path dir = fs::path(output_path.empty() ? "." : output_path) / job_name;
  std::error_code ec;
  fs::create_directories(dir, ec);
  DS_CHECK(!ec, "csv_monitor: cannot create directory '" << dir.string() << "': " << ec.message()
                << " (check csv_monitor.output_path / job_name)");
  path_ = (dir / kFileName).string();
  const bool fresh = !fs::exists(path_) || fs::file_size(path_) == 0;
  f_ = std::fopen(path_.c_str(), "a");
  DS_CHECK(f_ != nullptr, "csv_monitor: cannot open '" << path_ << "' for writing: " << std::strerror(errno));
  if (fresh) {
    std::fprintf(f_, "%s\n", kHeader);
    std::fflush(f_);
  }
}

CsvMonitor::~CsvMonitor() {
  if (f_) std::fclose(f_);
}

void CsvMonitor::write(const CsvRow& r) {
  std::fprintf(f_, "%lld,%lld,%.9g,%.9g,%.9g,%.9g,%d,%lld,%.3f\n", (long long)r.step,
               (long long)r.samples, r.loss, r.lr, r.loss_scale, r.grad_norm, r.overflow ? 1 : 0,
               (long long)r.skipped_steps, r.step_time_ms);
  std::fflush(f_);
}

TensorBoardMonitor::TensorBoardMonitor(const std::string& output_path, const std::string& job_name, bool fp16)
    : fp16_(fp16) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(output_path.empty() ? "." : output_path) / job_name;
  try {
    events_ = std::make_unique<io::EventWriter>(dir.string());
  } catch (const Error& e) {
    DS_THROW(e.message() << " (check tensorboard.output_path / job_name)");
  }
}

TensorBoardMonitor::~TensorBoardMonitor() = default;

const std::string& TensorBoardMonitor::path() const { return events_->path(); }

void TensorBoardMonitor::write(const CsvRow& r) {
  std::vector<std::pair<std::string, float>> s = {{"Train/Samples/train_loss", float(r.loss)},
                                                  {"Train/Samples/lr", float(r.lr)}};
  if (fp16_) s.emplace_back("Train/Samples/loss_scale", float(r.loss_scale));
  if (last_samples_ >= 0 && r.step_time_ms > 0)
    s.emplace_back("Train/Samples/samples_per_sec", float(double(r.samples - last_samples_) * 1e3 / r.step_time_ms));
  last_samples_ = r.samples;
  events_->add_scalars(r.samples, s);
}

void TensorBoardMonitor::write_eval_loss(std::int64_t samples, double loss) {
  events_->add_scalars(samples, {{"Train/Samples/eval_loss", float(loss)}});
}

Monitors::Monitors(const config::DsConfig& cfg, bool make) {
  if (!make) return;
  if (cfg.csv_monitor.enabled) csv_ = std::make_unique<CsvMonitor>(cfg.csv_monitor.output_path, cfg.csv_monitor.job_name);
  if (cfg.tensorboard.enabled)
    tb_ = std::make_unique<TensorBoardMonitor>(cfg.tensorboard.output_path, cfg.tensorboard.job_name, cfg.fp16.enabled);
}

Monitors::~Monitors() = default;

void Monitors::write(const CsvRow& row) {
  if (csv_) csv_->write(row);
  if (tb_) tb_->write(row);
}

void Monitors::write_eval_loss(std::int64_t samples, double loss) {
  if (tb_) tb_->write_eval_loss(samples, loss);
}

}  // namespace ds::engine
