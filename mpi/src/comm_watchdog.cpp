// CommWatchdog: see comm_watchdog.h.
#include "comm_watchdog.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "ds/core/env.h"
#include "ds/core/error.h"

#include "ds/mpi/init.h"

namespace ds::detail {

std::int64_t CommWatchdog::now_ns() noexcept {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);  // vDSO: no system call
  return static_cast<std::int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::optional<double> comm_timeout_from_env() {
  const auto v = env::raw("DS_COMM_TIMEOUT");
  if (!v) return std::nullopt;
  try {
    return env::get_seconds("DS_COMM_TIMEOUT");
  } catch (const Error&) {  // this message is the one docs and tests know
    DS_THROW("environment variable DS_COMM_TIMEOUT='" << *v << "' is not a number of seconds (0 = no timeout)");
  }
}

CommWatchdog::CommWatchdog(int rank, std::function<std::string(std::uint64_t)> not_arrived)
    : rank_(rank), not_arrived_(std::move(not_arrived)) {}

CommWatchdog::~CommWatchdog() { shutdown(); }

void CommWatchdog::shutdown() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
    armed_.store(false, std::memory_order_relaxed);
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void CommWatchdog::set_timeout(double seconds) {
  const double t = seconds > 0 ? seconds : 0.0;
  {
    std::lock_guard lk(mu_);
    timeout_s_.store(t, std::memory_order_relaxed);
    armed_.store(t > 0 && !stop_, std::memory_order_relaxed);
    if (t > 0 && !stop_ && !thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  cv_.notify_all();
}

void CommWatchdog::loop() {
  // When this thread first saw each wait. A wait must also have been watched for half the
  // timeout: a process that was itself stopped (SIGSTOP, then SIGCONT when the job is torn
  // down) finds old waits on waking, and they are not the peers' fault.
  std::int64_t seen_since[kSlots] = {}, seen_at[kSlots] = {};
  std::unique_lock lk(mu_);
  while (!stop_) {
    const double t = timeout_s_.load(std::memory_order_relaxed);
    if (t <= 0) {
      cv_.wait(lk);
      continue;
    }
    // A quarter of the timeout, between 10 ms and 1 s: a stuck wait is reported at most one
    // period after its deadline.
    const double period = std::clamp(t / 4, 0.01, 1.0);
    cv_.wait_for(lk, std::chrono::duration<double>(period));
    if (stop_) break;
    const std::int64_t now = now_ns();
    for (int slot = 0; slot < kSlots; ++slot) {
      Wait& w = waits_[slot];
      const std::int64_t since = w.since_ns.load(std::memory_order_acquire);
      if (since != seen_since[slot]) seen_since[slot] = since, seen_at[slot] = now;
      if (since == 0 || static_cast<double>(now - since) < t * 1e9 ||
          static_cast<double>(now - seen_at[slot]) < t * 0.5e9)
        continue;
      const char* what = w.what.load(std::memory_order_relaxed);
      const std::uint64_t seq = w.seq.load(std::memory_order_relaxed);
      // The same wait still (not one that ended and began again while we read).
      if (w.since_ns.load(std::memory_order_acquire) != since) continue;
      lk.unlock();
      expire(what, seq, static_cast<double>(now - since) / 1e9);
    }
  }
}

void CommWatchdog::expire(const char* what, std::uint64_t seq, double waited_s) {
  std::string missing;
  try {
    missing = not_arrived_ ? not_arrived_(seq) : std::string();
  } catch (...) {
    missing.clear();
  }
  char head[256];
  std::snprintf(head, sizeof head,
                "comm timeout: rank %d waited %.0f s in collective %s #%llu (limit %g s: communication.timeout "
                "or DS_COMM_TIMEOUT); ",
                rank_, waited_s, what, static_cast<unsigned long long>(seq),
                timeout_s_.load(std::memory_order_relaxed));
  std::string line = head;
  line += missing.empty() ? "which ranks did not arrive is not known" : missing;
  line += "; aborting the job";
  abort_job(1, line);
}

}  // namespace ds::detail
