// The progress thread: a FIFO of non-blocking shared-memory operations, one thread per
// communicator, and the handle that waits for one of them (mpi_comm.h).
#include <exception>

#include "mpi_comm_impl.h"

namespace ds {

namespace {

struct TaskState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

class TaskHandle final : public CommHandle {
 public:
  TaskHandle(std::shared_ptr<TaskState> s, detail::OpTag tag) : s_(std::move(s)), tag_(std::move(tag)) {}
  ~TaskHandle() override {
    detail::CommWait w(*tag_.watchdog, detail::CommWatchdog::kCaller, tag_.what, tag_.seq);
    std::unique_lock lk(s_->mu);
    s_->cv.wait(lk, [&] { return s_->done; });
  }
  void wait() override {
    detail::CommWait w(*tag_.watchdog, detail::CommWatchdog::kCaller, tag_.what, tag_.seq);
    std::unique_lock lk(s_->mu);
    s_->cv.wait(lk, [&] { return s_->done; });
    if (s_->error) {
      auto e = s_->error;
      s_->error = nullptr;
      std::rethrow_exception(e);
    }
  }
  bool test() override {
    std::lock_guard lk(s_->mu);
    return s_->done;
  }

 private:
  std::shared_ptr<TaskState> s_;
  detail::OpTag tag_;
};

}  // namespace

CommWork MpiComm::Impl::submit(std::function<void()> fn, const char* what, std::uint64_t seq) {
  if (!threaded()) {
    detail::CommWait w(*watchdog, detail::CommWatchdog::kCaller, what, seq);
    fn();  // runs to completion here (no MPI_THREAD_MULTIPLE, or disabled)
    return std::make_unique<detail::DoneHandle>();
  }
  auto state = std::make_shared<TaskState>();
  {
    std::lock_guard lk(mu);
    if (!worker.joinable()) worker = std::thread([this] { worker_loop(); });
    ++in_flight;
    queue.emplace_back([state, fn = std::move(fn), wd = watchdog, what, seq] {
      std::exception_ptr err;
      try {
        detail::CommWait w(*wd, detail::CommWatchdog::kProgress, what, seq);
        fn();
      } catch (...) {
        err = std::current_exception();
      }
      std::lock_guard lk2(state->mu);
      state->error = err;
      state->done = true;
      state->cv.notify_all();
    });
  }
  cv.notify_one();
  return std::make_unique<TaskHandle>(state, tag(what, seq));
}

void MpiComm::Impl::worker_loop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stop requested and nothing left
      task = std::move(queue.front());
      queue.pop_front();
    }
    task();
    {
      std::lock_guard lk(mu);
      --in_flight;
    }
    idle_cv.notify_all();
  }
}

void MpiComm::Impl::drain() {
  std::unique_lock lk(mu);
  idle_cv.wait(lk, [&] { return in_flight == 0; });
}

}  // namespace ds
