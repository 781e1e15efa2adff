#include "report.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "ds/core/error.h"

namespace ds::train {

std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  auto s = static_cast<long long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lld:%02lld", s / 60, s % 60);
  return buf;
}

std::string printable(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (unsigned char c : bytes) out.push_back((c == '\n' || c == '\t' || (c >= 32 && c < 127)) ? char(c) : '?');
  return out;
}

Reporter::Reporter(bool enabled, bool bar, std::int64_t first_step, std::int64_t last_step,
                   std::int64_t tokens_per_step, std::optional<std::int64_t> engine_print_every,
                   const std::string& csv_path)
    : enabled_(enabled), bar_(bar), first_step_(first_step), last_step_(last_step),
      tokens_per_step_(tokens_per_step) {
  const std::int64_t n = std::max<std::int64_t>(1, last_step - first_step + 1);
  engine_prints_ = engine_print_every && *engine_print_every > 0;
  print_every_ = std::max<std::int64_t>(1, n / 10);
  if (enabled_ && !csv_path.empty()) {
    csv_ = std::fopen(csv_path.c_str(), "w");
    DS_CHECK(csv_ != nullptr, "cannot write --loss_csv " << csv_path << ": " << std::strerror(errno));
    std::fprintf(csv_, "step,loss,lr,grad_norm,loss_scale,val_loss\n");
    std::fflush(csv_);
  }
}

Reporter::~Reporter() {
  if (csv_) std::fclose(csv_);
}

double Reporter::tokens_per_s() const {
  if (steps_done_ >= 2 && last_step_end_s_ > first_step_end_s_)
    return double(steps_done_ - 1) * double(tokens_per_step_) / (last_step_end_s_ - first_step_end_s_);
  if (steps_done_ >= 1 && last_step_end_s_ > 0) return double(steps_done_) * double(tokens_per_step_) / last_step_end_s_;
  return 0;
}

void Reporter::step(const StepRecord& r) {
  if (!enabled_) return;
  ++steps_done_;
  current_step_ = r.step;
  last_step_end_s_ = clock_.elapsed_s();
  if (first_step_end_s_ < 0) first_step_end_s_ = last_step_end_s_;
  last_loss_ = r.loss;
  last_lr_ = r.lr;
  if (r.val_loss) last_val_ = r.val_loss;

  if (csv_) {
    std::fprintf(csv_, "%lld,%.9g,%.9g,%.9g,%.9g,", static_cast<long long>(r.step), r.loss, r.lr,
                 r.grad_norm, r.loss_scale);
    if (r.val_loss) std::fprintf(csv_, "%.9g", *r.val_loss);
    std::fprintf(csv_, "\n");
    std::fflush(csv_);
  }

  if (bar_) {
    if (r.val_loss) {
      char line[128];
      std::snprintf(line, sizeof line, "step %lld: validation loss %.4f", static_cast<long long>(r.step), *r.val_loss);
      note(line);
    }
    draw_bar(r.step == last_step_);
    return;
  }
  // With steps_per_print set the engine prints DeepSpeed's progress lines itself; ours would
  // repeat them. Without it, about ten lines a run.
  const bool due = !engine_prints_ &&
                   ((r.step - first_step_ + 1) % print_every_ == 0 || r.step == last_step_ || r.step == first_step_);
  if (due) {
    std::printf("[train] step=%lld/%lld loss=%.4f lr=%.4e grad_norm=%.4f", static_cast<long long>(r.step),
                static_cast<long long>(last_step_), r.loss, r.lr, r.grad_norm);
    if (r.loss_scale != 1.0) std::printf(" loss_scale=%g", r.loss_scale);
    std::printf(" %s/s=%.0f elapsed=%s\n", unit_.c_str(), tokens_per_s(), format_duration(last_step_end_s_).c_str());
  }
  if (r.val_loss) {
    const std::int64_t done = r.step - first_step_ + 1, left = last_step_ - r.step;
    std::printf("[train] step=%lld/%lld val_loss=%.4f train_loss=%.4f elapsed=%s eta=%s\n",
                static_cast<long long>(r.step), static_cast<long long>(last_step_), *r.val_loss, r.loss,
                format_duration(last_step_end_s_).c_str(),
                format_duration(done > 0 ? last_step_end_s_ / double(done) * double(left) : 0).c_str());
  }
  if (due || r.val_loss) std::fflush(stdout);
}

void Reporter::note(const std::string& line) {
  if (!enabled_) return;
  if (bar_ && bar_open_) std::printf("\r\033[K");
  std::printf("%s%s\n", bar_ ? "" : "[train] ", line.c_str());
  if (bar_ && bar_open_) draw_bar(true);
  std::fflush(stdout);
}

void Reporter::draw_bar(bool force) {
  const double now = clock_.elapsed_s();
  if (!force && last_draw_s_ >= 0 && now - last_draw_s_ < 0.1) return;
  last_draw_s_ = now;
  const std::int64_t total = std::max<std::int64_t>(1, last_step_ - first_step_ + 1);
  const std::int64_t done = std::min(total, std::max<std::int64_t>(0, current_step_ - first_step_ + 1));
  const double frac = double(done) / double(total);
  constexpr int width = 24;
  const int filled = static_cast<int>(frac * width);
  std::string bar(std::size_t(filled), '#');
  bar.append(std::size_t(width - filled), '.');
  const double tps = tokens_per_s();
  const double eta = done > 0 ? now / double(done) * double(total - done) : -1;
  std::printf("\r\033[Kstep %lld/%lld [%s] %3.0f%%", static_cast<long long>(current_step_),
              static_cast<long long>(last_step_), bar.c_str(), frac * 100);
  if (last_loss_) std::printf(" | loss %.4f", *last_loss_);
  if (last_val_) std::printf(" | val %.4f", *last_val_);
  std::printf(" | %.0f %s/s | %s<%s", tps, unit_ == "tokens" ? "tok" : unit_.c_str(), format_duration(now).c_str(),
              format_duration(eta).c_str());
  std::fflush(stdout);
  bar_open_ = true;
}

void Reporter::finish_bar() {
  if (!enabled_ || !bar_ || !bar_open_) return;
  std::printf("\n");
  std::fflush(stdout);
  bar_open_ = false;
}

}  // namespace ds::train
