#include "ds/engine/monitor.h"

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ds/core/error.h"

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

}  // namespace ds::engine
