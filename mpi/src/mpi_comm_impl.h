// MpiComm's private state and the pieces its source files share (private to ds_mpi):
//   mpi_comm.cpp          dispatch: the public calls, their checks, and which path each takes
//   mpi_comm_setup.cpp    communicators, window, CPU count, deadline; teardown
//   shm_collectives.cpp   the shared-memory window collectives and their reduction kernels
//   plain_collectives.cpp the plain MPI collectives (blocking and MPI_I*)
//   progress_queue.cpp    handles and the progress thread that runs non-blocking shm calls
//   mpi_types.cpp         MPI datatypes and ops for the dtypes
#pragma once

#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "comm_watchdog.h"
#include "ds/core/spin_wait.h"
#include "check.h"
#include "ds/mpi/mpi_comm.h"

namespace ds {

namespace detail {

inline const char* ptr(const TensorView& v, std::size_t elems) {
  return static_cast<const char*>(v.data) + elems * dtype_size(v.dtype);
}
inline char* mptr(const TensorView& v, std::size_t elems) {
  return static_cast<char*>(v.data) + elems * dtype_size(v.dtype);
}

class DoneHandle final : public CommHandle {
 public:
  void wait() override {}
  bool test() override { return true; }
};


// Which collective a handle belongs to, for the deadline's message.
struct OpTag {
  std::shared_ptr<detail::CommWatchdog> watchdog;
  const char* what = "";
  std::uint64_t seq = 0;
};

// MPI_I* requests, plus the avg division once they complete.
class RequestHandle final : public CommHandle {
 public:
  RequestHandle(std::vector<MPI_Request> reqs, std::function<void()> after, OpTag tag)
      : reqs_(std::move(reqs)), after_(std::move(after)), tag_(std::move(tag)) {}
  ~RequestHandle() override {
    // Abandoned without wait(): the buffers must stay valid until the operation is done anyway.
    if (!done_) {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) {
        detail::CommWait w(*tag_.watchdog, detail::CommWatchdog::kCaller, tag_.what, tag_.seq);
        MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
      }
    }
  }
  void wait() override {
    if (done_) return;
    {
      detail::CommWait w(*tag_.watchdog, detail::CommWatchdog::kCaller, tag_.what, tag_.seq);
      DS_MPI_CHECK(MPI_Waitall(static_cast<int>(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE));
    }
    finish();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    DS_MPI_CHECK(MPI_Testall(static_cast<int>(reqs_.size()), reqs_.data(), &flag, MPI_STATUSES_IGNORE));
    if (flag) finish();
    return done_;
  }

 private:
  void finish() {
    done_ = true;
    if (after_) after_();
  }
  std::vector<MPI_Request> reqs_;
  std::function<void()> after_;
  OpTag tag_;
  bool done_ = false;
};


}  // namespace detail

struct MpiComm::Impl {
  MpiCommOptions opt;
  std::shared_ptr<detail::MpiRuntime> runtime;
  MPI_Comm comm = MPI_COMM_NULL;   // plain collectives (caller thread)
  MPI_Comm node = MPI_COMM_NULL;   // ranks of this node (shm window, barriers)
  MPI_Comm cross = MPI_COMM_NULL;  // ranks with this local rank on every node
  int rank = 0, size = 1, node_rank = 0, node_size = 1, nnodes = 1;
  bool uniform = true;             // every node has node_size ranks
  bool oversub = false;            // node ranks > CPUs they may run on (union of affinities)
  int spin_limit = 256;            // pause-spins in a barrier before yielding the CPU
  int thread_level = MPI_THREAD_SINGLE;

  MPI_Win win = MPI_WIN_NULL;
  std::vector<char*> seg;          // each node rank's segment (two halves)
  std::size_t half_bytes = 0;
  std::uint64_t chunk_seq = 0;     // alternates the halves across chunks and operations

  // progress thread: FIFO of shm operations
  std::thread worker;
  std::mutex mu;
  std::condition_variable cv, idle_cv;
  std::deque<std::function<void()>> queue;
  int in_flight = 0;               // queued + running
  bool stop = false;

  // --- collective deadline (comm_watchdog.h) ---
  std::shared_ptr<detail::CommWatchdog> watchdog;
  std::uint64_t op_seq = 0;        // collectives called so far (the same count on every rank)
  // Every collective call: its sequence number, also published in this rank's control page
  // (one store) so that a peer that times out can tell which node ranks never arrived.
  std::uint64_t arrive() {
    const std::uint64_t seq = ++op_seq;
    if (win != MPI_WIN_NULL)
      std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(ctrl[node_rank] + kArrivedOffset))
          .store(seq, std::memory_order_relaxed);
    return seq;
  }
  detail::OpTag tag(const char* what, std::uint64_t seq) const { return detail::OpTag{watchdog, what, seq}; }
  std::string not_arrived(std::uint64_t seq) const;

  ~Impl();
  void setup(MPI_Comm parent);

  // --- shm path ---
  // A window exists and the path is on: set_paths() may turn it off after setup (the window
  // then stays allocated, unused, and still tells a timeout which node ranks arrived).
  bool shm_on() const { return win != MPI_WIN_NULL && opt.shm; }
  // The bands hold for blocking calls. A non-blocking call that the progress thread will run
  // keeps the window whatever its size: it overlaps the caller's compute, while Open MPI
  // progresses an MPI_I* request only inside the caller's MPI calls.
  // `band` holds at one rank per CPU, `band_oversubscribed` on an oversubscribed node.
  bool in_plain_band(const SizeBand& band, const SizeBand& band_oversubscribed, std::size_t bytes,
                     bool nonblocking) const {
    if (nonblocking && threaded()) return false;
    return (oversub ? band_oversubscribed : band).contains(bytes);
  }
  bool use_shm_allreduce(std::size_t bytes, bool nonblocking) const {
    return shm_on() && bytes >= opt.shm_min_all_reduce &&
           !in_plain_band(opt.plain_all_reduce, opt.plain_all_reduce_oversubscribed, bytes, nonblocking) &&
           (nnodes == 1 || uniform);
  }
  bool use_shm_reduce_scatter(std::size_t bytes, bool nonblocking) const {
    return shm_on() && nnodes == 1 && bytes >= opt.shm_min_reduce_scatter &&
           !in_plain_band(opt.plain_reduce_scatter, SizeBand{}, bytes, nonblocking);
  }
  bool use_shm_all_gather(std::size_t bytes, bool nonblocking, bool in_place) const {
    return shm_on() && nnodes == 1 && bytes >= opt.shm_min_all_gather &&
           !(in_place ? in_plain_band(opt.plain_all_gather_in_place, SizeBand{}, bytes, nonblocking)
                      : in_plain_band(opt.plain_all_gather, opt.plain_all_gather_oversubscribed, bytes, nonblocking));
  }
  // Segment layout: one 4 KiB control page (this rank's barrier counter in its first cache
  // line), then the two data halves.
  static constexpr std::size_t kCtrlBytes = 4096;
  // Control page: barrier counter at 0; the rank's last collective sequence number (arrive()),
  // its rank in `comm` and its process id on their own cache lines, read by peers only after
  // a timeout.
  static constexpr std::size_t kArrivedOffset = 64, kRankOffset = 128, kPidOffset = 192;
  std::vector<char*> ctrl;         // each node rank's control page
  std::uint64_t barrier_seq = 0;   // barriers passed (the same count on every node rank)
  char* half(int r, std::uint64_t seq) const { return seg[r] + (seq & 1) * half_bytes; }
  // Node barrier through the window: publish my count (release: my copies into the window
  // are visible first), then wait until every peer's count reached it (acquire). Spins
  // briefly, then yields the CPU (ranks may outnumber cores).
  void sync_barrier() {
    const std::uint64_t target = ++barrier_seq;
    std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(ctrl[node_rank])).store(target, std::memory_order_release);
    for (int r = 0; r < node_size; ++r) {
      if (r == node_rank) continue;
      std::atomic_ref<std::uint64_t> peer(*reinterpret_cast<std::uint64_t*>(ctrl[r]));
      spin_then_yield([&] { return peer.load(std::memory_order_acquire) >= target; }, spin_limit);
    }
  }
  void shm_all_reduce(TensorView buf, ReduceOp op);
  void shm_all_reduce_oneshot(TensorView buf, ReduceOp op);
  void shm_reduce_scatter(TensorView send, TensorView recv, ReduceOp op);
  // The general form: block j of the input starts offs[j] elements into `send` and is
  // counts[j] long; this rank's reduced block goes to `out` (which may be its own input block).
  void shm_reduce_scatter_blocks(const void* send, std::span<const std::size_t> offs,
                                 std::span<const std::size_t> counts, void* out, DType t, ReduceOp op);
  void shm_all_gather(TensorView send, TensorView recv);

  // --- plain path ---
  void mpi_all_reduce(TensorView buf, ReduceOp op, std::vector<MPI_Request>* reqs);
  void mpi_reduce_scatter(TensorView send, TensorView recv, ReduceOp op, std::vector<MPI_Request>* reqs);
  void mpi_all_gather(TensorView send, TensorView recv, std::vector<MPI_Request>* reqs);
  // ireduce_scatter_in_place over plain MPI. Non-blocking (reqs != nullptr): returns what to
  // run once the requests completed (the avg division; empty otherwise); blocking: done on
  // return.
  std::function<void()> mpi_reduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op,
                                                    std::vector<MPI_Request>* reqs);

  // --- progress thread ---
  bool threaded() const { return opt.progress_thread && thread_level >= MPI_THREAD_MULTIPLE; }
  CommWork submit(std::function<void()> fn, const char* what, std::uint64_t seq);
  void drain();
  void worker_loop();
};

}  // namespace ds
