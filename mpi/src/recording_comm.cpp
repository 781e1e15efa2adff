// The comms_logger's communicator: every operation runs on the wrapped one and is recorded
// in the shared CommsLog (comms_logger.h). Blocking calls are timed around the call;
// non-blocking ones from the issuing call to the wait() or test() that saw them complete.
#include <chrono>

#include "ds/mpi/comms_logger.h"

namespace ds {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// One operation in flight: records once, when it is first seen complete.
class RecordingHandle final : public CommHandle {
 public:
  RecordingHandle(CommWork inner, std::shared_ptr<CommsLog> log, CommOp op, std::size_t bytes,
                  Clock::time_point start)
      : inner_(std::move(inner)), log_(std::move(log)), op_(op), bytes_(bytes),
        caller_(CommCallerScope::current()), start_(start) {}
  ~RecordingHandle() override {
    if (done_) return;
    inner_.reset();  // waits for the operation (the handle contract)
    finish();
  }
  void wait() override {
    inner_->wait();
    finish();
  }
  bool test() override {
    const bool complete = inner_->test();
    if (complete) finish();
    return complete;
  }
  void order_stream(void* stream) override { inner_->order_stream(stream); }

 private:
  void finish() {
    if (done_) return;
    done_ = true;
    log_->record(op_, bytes_, seconds_since(start_), caller_);
  }

  CommWork inner_;
  std::shared_ptr<CommsLog> log_;
  CommOp op_;
  std::size_t bytes_;
  const char* caller_;
  Clock::time_point start_;
  bool done_ = false;
};

class RecordingComm final : public Communicator {
 public:
  RecordingComm(std::shared_ptr<Communicator> inner, std::shared_ptr<CommsLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend() const override { return inner_->backend(); }

  void all_reduce(TensorView buf, ReduceOp op) override {
    timed(CommOp::AllReduce, buf.bytes(), [&] { inner_->all_reduce(buf, op); });
  }
  CommWork iall_reduce(TensorView buf, ReduceOp op) override {
    return started(CommOp::AllReduce, buf.bytes(), [&] { return inner_->iall_reduce(buf, op); });
  }
  void reduce_scatter(TensorView send, TensorView recv, ReduceOp op) override {
    timed(CommOp::ReduceScatter, send.bytes(), [&] { inner_->reduce_scatter(send, recv, op); });
  }
  CommWork ireduce_scatter(TensorView send, TensorView recv, ReduceOp op) override {
    return started(CommOp::ReduceScatter, send.bytes(), [&] { return inner_->ireduce_scatter(send, recv, op); });
  }
  // ZeRO's reduce of each block to its rank moves a reduce-scatter's bytes (uneven blocks).
  CommWork ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) override {
    return started(CommOp::ReduceScatter, buf.bytes(),
                   [&] { return inner_->ireduce_scatter_in_place(buf, counts, op); });
  }
  void all_gather(TensorView send, TensorView recv) override {
    timed(CommOp::AllGather, recv.bytes(), [&] { inner_->all_gather(send, recv); });
  }
  CommWork iall_gather(TensorView send, TensorView recv) override {
    return started(CommOp::AllGather, recv.bytes(), [&] { return inner_->iall_gather(send, recv); });
  }
  void broadcast(TensorView buf, int root) override {
    timed(CommOp::Broadcast, buf.bytes(), [&] { inner_->broadcast(buf, root); });
  }
  void barrier() override {
    timed(CommOp::Barrier, 0, [&] { inner_->barrier(); });
  }

  void set_compute_stream(void* stream) override { inner_->set_compute_stream(stream); }
  void set_timeout(double seconds) override { inner_->set_timeout(seconds); }
  double timeout() const override { return inner_->timeout(); }
  void set_paths(const CommPaths& paths) override { inner_->set_paths(paths); }

 private:
  template <class Run>
  void timed(CommOp op, std::size_t bytes, Run&& run) {
    if (!log_->wants(op)) return run();
    const Clock::time_point start = Clock::now();
    run();
    log_->record(op, bytes, seconds_since(start), CommCallerScope::current());
  }
  template <class Start>
  CommWork started(CommOp op, std::size_t bytes, Start&& start) {
    if (!log_->wants(op)) return start();
    // The clock starts before the inner call: a backend that completes the operation inside
    // it (no progress thread) has done the whole transfer there.
    const Clock::time_point t0 = Clock::now();
    CommWork inner = start();
    return std::make_unique<RecordingHandle>(std::move(inner), log_, op, bytes, t0);
  }

  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<CommsLog> log_;
};

}  // namespace

std::shared_ptr<Communicator> make_recording_communicator(std::shared_ptr<Communicator> inner,
                                                          std::shared_ptr<CommsLog> log) {
  return std::make_shared<RecordingComm>(std::move(inner), std::move(log));
}

}  // namespace ds
