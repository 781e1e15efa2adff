// A deadline for collectives (MpiComm): a rank stuck waiting for a peer that never arrives (a
// stopped or dead process, a lost node) ends the job with one line instead of hanging it.
//
// The waiting threads only publish "waiting since T in collective NAME #SEQ" (a clock read
// and a few relaxed stores, no syscall); one watchdog thread per communicator looks every
// timeout/4 (at most 1 s) and, when a wait is older than the timeout, prints the line and
// calls MPI_Abort. The collectives themselves stay the blocking MPI calls and the window's
// spin barriers, so the normal path keeps its speed.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ds::detail {

// DS_COMM_TIMEOUT=SECONDS (0: no deadline), when set; a malformed value is an error naming it.
// Every communicator with a deadline reads it here, and it wins over the config's value.
std::optional<double> comm_timeout_from_env();

class CommWatchdog {
 public:
  // Waiting threads: the caller's and the communicator's progress thread.
  enum Slot { kCaller = 0, kProgress = 1, kSlots = 2 };

  // `rank`: this rank in the communicator (for the message). `not_arrived(seq)`: which ranks
  // are known not to have reached collective `seq` yet (text), asked once, at the timeout.
  CommWatchdog(int rank, std::function<std::string(std::uint64_t)> not_arrived);
  ~CommWatchdog();
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;

  // Stops the watchdog thread (idempotent); later waits are not watched. MpiComm calls it
  // before what `not_arrived` reads goes away.
  void shutdown();

  // Seconds a collective may wait; 0 turns the deadline off. Not collective: every rank
  // should use the same value.
  void set_timeout(double seconds);
  double timeout() const { return timeout_s_.load(std::memory_order_relaxed); }

  // `what` must be a string literal (it is read by the watchdog thread later).
  void begin(Slot slot, const char* what, std::uint64_t seq) noexcept {
    if (!armed_.load(std::memory_order_relaxed)) return;
    Wait& w = waits_[slot];
    w.what.store(what, std::memory_order_relaxed);
    w.seq.store(seq, std::memory_order_relaxed);
    w.since_ns.store(now_ns(), std::memory_order_release);
  }
  void end(Slot slot) noexcept { waits_[slot].since_ns.store(0, std::memory_order_relaxed); }

  static std::int64_t now_ns() noexcept;

 private:
  struct Wait {
    std::atomic<std::int64_t> since_ns{0};  // 0: not waiting
    std::atomic<const char*> what{""};
    std::atomic<std::uint64_t> seq{0};
  };
  void loop();
  [[noreturn]] void expire(const char* what, std::uint64_t seq, double waited_s);

  const int rank_;
  std::function<std::string(std::uint64_t)> not_arrived_;
  std::atomic<bool> armed_{false};
  std::atomic<double> timeout_s_{0.0};
  Wait waits_[kSlots];
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Scoped begin/end.
class CommWait {
 public:
  CommWait(CommWatchdog& w, CommWatchdog::Slot slot, const char* what, std::uint64_t seq) noexcept
      : w_(w), slot_(slot) {
    w_.begin(slot, what, seq);
  }
  ~CommWait() { w_.end(slot_); }
  CommWait(const CommWait&) = delete;
  CommWait& operator=(const CommWait&) = delete;

 private:
  CommWatchdog& w_;
  CommWatchdog::Slot slot_;
};

}  // namespace ds::detail
