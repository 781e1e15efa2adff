// StagedComm: device collectives staged through pinned host memory over MpiComm
// (staged_comm.h). Compiled in every build; without CUDA the constructor throws.
#include "ds/mpi/staged_comm.h"

#include "ds/core/error.h"

#if DS_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ds/core/cuda_check.h"
#include "ds/mpi/mpi_comm.h"
#include "check.h"
#endif

namespace ds {

#if DS_HAVE_CUDA

namespace {

// Staging blocks are rounded up to this, so that buckets of nearby sizes reuse one block.
constexpr std::size_t kGrain = std::size_t(64) << 10;

struct Block {
  void* p = nullptr;
  std::size_t bytes = 0;
};

// Pinned host blocks kept for reuse: cudaMallocHost costs far more than a copy of a bucket.
class PinnedPool {
 public:
  PinnedPool() = default;
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;
  ~PinnedPool() { release_free(); }

  // The smallest free block of at least `bytes`, else a new one.
  Block take(std::size_t bytes) {
    std::size_t best = free_.size();
    for (std::size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes >= bytes && (best == free_.size() || free_[i].bytes < free_[best].bytes)) best = i;
    }
    if (best != free_.size()) {
      const Block b = free_[best];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(best));
      return b;
    }
    Block b;
    b.bytes = (std::max<std::size_t>(bytes, 1) + kGrain - 1) / kGrain * kGrain;
    if (cudaMallocHost(&b.p, b.bytes) != cudaSuccess) {
      cudaGetLastError();  // out of pinned memory: give the cached blocks back and retry once
      release_free();
      DS_CUDA_CHECK(cudaMallocHost(&b.p, b.bytes));
    }
    return b;
  }
  void give(Block& b) {
    if (b.p) free_.push_back(b);
    b = Block{};
  }

 private:
  void release_free() {
    for (const Block& b : free_) cudaFreeHost(b.p);
    free_.clear();
  }
  std::vector<Block> free_;
};

// A block on loan for one operation: back to the pool when the operation is done (or fails
// before its host collective started).
class Lease {
 public:
  Lease(PinnedPool& pool, std::size_t bytes) : pool_(&pool), b_(pool.take(bytes)) {}
  Lease(Lease&& o) noexcept : pool_(o.pool_), b_(o.b_) { o.b_ = Block{}; }
  Lease& operator=(Lease&&) = delete;
  ~Lease() { pool_->give(b_); }
  char* data() const { return static_cast<char*>(b_.p); }

 private:
  PinnedPool* pool_;
  Block b_;
};

// One non-blocking operation in flight.
struct Op {
  CommWork host;  // the host collective on the staging blocks
  std::vector<Lease> blocks;
  void* dev_out = nullptr;  // where the result goes (nullptr: nowhere)
  const void* host_out = nullptr;
  std::size_t out_bytes = 0;
  bool copy_back = true;  // false once its handle was dropped without wait()
  bool done = false;
};

}  // namespace

struct StagedComm::State {
  int device = 0;
  cudaStream_t compute = nullptr;
  std::unique_ptr<MpiComm> host;
  PinnedPool pool;  // declared before `inflight`: the leases go back before the pool is freed
  std::deque<std::shared_ptr<Op>> inflight;  // started, not yet completed, oldest first

  ~State() {
    // Handles dropped with their communicator: the host collectives must still end before
    // their staging memory is freed; nobody is left to receive the results.
    for (auto& op : inflight) {
      try {
        if (op->host) op->host->wait();
      } catch (...) {
      }
    }
    inflight.clear();
  }

  void use_device() { DS_CUDA_CHECK(cudaSetDevice(device)); }
  // Device -> staging on the compute stream, after the work enqueued there so far.
  void copy_in(void* host_dst, const void* dev_src, std::size_t bytes) {
    if (bytes) DS_CUDA_CHECK(cudaMemcpyAsync(host_dst, dev_src, bytes, cudaMemcpyDeviceToHost, compute));
  }
  void copy_out(void* dev_dst, const void* host_src, std::size_t bytes) {
    if (bytes) DS_CUDA_CHECK(cudaMemcpyAsync(dev_dst, host_src, bytes, cudaMemcpyHostToDevice, compute));
  }
  void sync() { DS_CUDA_CHECK(cudaStreamSynchronize(compute)); }

  // Completes `op`: its host collective, then (unless dropped) the copy back, finished on the
  // device before this returns.
  void finish(Op& op) {
    if (op.host) op.host->wait();
    op.host.reset();
    if (op.copy_back && op.dev_out && op.out_bytes) {
      use_device();
      copy_out(op.dev_out, op.host_out, op.out_bytes);
      sync();
    }
    op.blocks.clear();
    op.done = true;
  }
  // Completes every operation up to and including `op`, oldest first (the handles' order).
  void complete_through(const Op* op) {
    while (!inflight.empty()) {
      std::shared_ptr<Op> front = inflight.front();
      inflight.pop_front();
      finish(*front);
      if (front.get() == op) return;
    }
  }
  bool ready_through(const Op* op) {
    for (auto& o : inflight) {
      if (o->host && !o->host->test()) return false;
      if (o.get() == op) break;
    }
    return true;
  }

  // The collective's last step: blocking, run `blocking_op` on the host and copy the result
  // back now; otherwise start `start_op` on the host and queue the rest for the handle.
  template <class Blocking, class Start>
  void run(bool blocking, std::vector<Lease> blocks, void* dev_out, const void* host_out,
               std::size_t out_bytes, Blocking&& blocking_op, Start&& start_op);
};

namespace {

class StagedHandle final : public CommHandle {
 public:
  StagedHandle(std::shared_ptr<StagedComm::State> s, std::shared_ptr<Op> op) : s_(std::move(s)), op_(std::move(op)) {}
  ~StagedHandle() override {
    if (op_->done) return;
    op_->copy_back = false;  // the caller gave the buffers up
    try {
      s_->complete_through(op_.get());
    } catch (...) {
      // the host collective failed; nothing to report to from a destructor
    }
  }
  void wait() override {
    if (!op_->done) s_->complete_through(op_.get());
  }
  bool test() override {
    if (op_->done) return true;
    if (!s_->ready_through(op_.get())) return false;
    wait();
    return true;
  }

 private:
  std::shared_ptr<StagedComm::State> s_;
  std::shared_ptr<Op> op_;
};

}  // namespace

template <class Blocking, class Start>
void StagedComm::State::run(bool blocking, std::vector<Lease> blocks, void* dev_out, const void* host_out,
                            std::size_t out_bytes, Blocking&& blocking_op, Start&& start_op) {
  if (blocking) {
    blocking_op();
    if (dev_out && out_bytes) {
      copy_out(dev_out, host_out, out_bytes);
      sync();
    }
    return;  // `blocks` go back to the pool here
  }
  auto op = std::make_shared<Op>();
  op->host = start_op();
  op->blocks = std::move(blocks);
  op->dev_out = dev_out;
  op->host_out = host_out;
  op->out_bytes = out_bytes;
  inflight.push_back(op);
}

namespace {

void check_rs(const TensorView& send, const TensorView& recv, int size) {
  if (send.dtype != recv.dtype)
    DS_THROW("StagedComm::reduce_scatter: send dtype " << dtype_name(send.dtype) << " differs from recv dtype "
                                                       << dtype_name(recv.dtype));
  if (send.count != recv.count * static_cast<std::size_t>(size))
    DS_THROW("StagedComm::reduce_scatter: send.count (" << send.count << ") must equal recv.count (" << recv.count
                                                        << ") * size (" << size << ")");
}

void check_ag(const TensorView& send, const TensorView& recv, int size) {
  if (send.dtype != recv.dtype)
    DS_THROW("StagedComm::all_gather: send dtype " << dtype_name(send.dtype) << " differs from recv dtype "
                                                   << dtype_name(recv.dtype));
  if (recv.count != send.count * static_cast<std::size_t>(size))
    DS_THROW("StagedComm::all_gather: recv.count (" << recv.count << ") must equal send.count (" << send.count
                                                    << ") * size (" << size << ")");
}

// This rank's usable device, or why not (every rank learns whether all have one, so that
// no rank is left waiting in the host communicator's collective constructor).
std::string device_problem(int device) {
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device visible (") + cudaGetErrorString(rc) + ")";
  }
  if (count == 0) return "no CUDA device visible (0 devices)";
  if (device < 0 || device >= count) {
    return "device " + std::to_string(device) + " out of range (" + std::to_string(count) +
           " visible); ranks may share a device: set CUDA_VISIBLE_DEVICES to the devices to use";
  }
  return {};
}

}  // namespace

StagedComm::StagedComm(MPI_Comm comm, int device, std::shared_ptr<detail::MpiRuntime> runtime)
    : state_(std::make_shared<State>()) {
  const std::string problem = device_problem(device);
  int ok = problem.empty() ? 1 : 0, all = 0;
  DS_MPI_CHECK(MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm));
  if (!problem.empty()) DS_THROW("StagedComm: " << problem);
  if (!all) DS_THROW("StagedComm: another rank has no usable CUDA device (its error names why)");
  state_->device = device;
  state_->use_device();
  state_->host = std::make_unique<MpiComm>(comm, MpiCommOptions::from_env(), std::move(runtime));
}

StagedComm::~StagedComm() = default;  // the handles in flight keep the state

int StagedComm::rank() const { return state_->host->rank(); }
int StagedComm::size() const { return state_->host->size(); }
void StagedComm::set_compute_stream(void* stream) { state_->compute = static_cast<cudaStream_t>(stream); }
void StagedComm::set_timeout(double seconds) { state_->host->set_timeout(seconds); }
double StagedComm::timeout() const { return state_->host->timeout(); }
void StagedComm::set_paths(const CommPaths& paths) { state_->host->set_paths(paths); }

namespace {

// The handle of the operation `run` just queued (none for a blocking call).
CommWork handle_for(const std::shared_ptr<StagedComm::State>& s, bool blocking) {
  if (blocking) return nullptr;
  return std::make_unique<StagedHandle>(s, s->inflight.back());
}

// The device buffer `buf` copied into one pinned block (after the compute stream's work so far).
std::vector<Lease> stage_whole(StagedComm::State& s, TensorView buf) {
  s.use_device();
  std::vector<Lease> blocks;
  blocks.emplace_back(s.pool, buf.bytes());
  s.copy_in(blocks[0].data(), buf.data, buf.bytes());
  s.sync();
  return blocks;
}

CommWork staged_all_reduce(const std::shared_ptr<StagedComm::State>& sp, TensorView buf, ReduceOp op, bool blocking) {
  StagedComm::State& s = *sp;
  std::vector<Lease> blocks = stage_whole(s, buf);
  char* h = blocks[0].data();
  const TensorView hv{h, buf.count, buf.dtype};
  s.run(blocking, std::move(blocks), buf.data, h, buf.bytes(), [&] { s.host->all_reduce(hv, op); },
        [&] { return s.host->iall_reduce(hv, op); });
  return handle_for(sp, blocking);
}

CommWork staged_reduce_scatter(const std::shared_ptr<StagedComm::State>& sp, TensorView send, TensorView recv,
                               ReduceOp op, bool blocking) {
  StagedComm::State& s = *sp;
  check_rs(send, recv, s.host->size());
  s.use_device();
  std::vector<Lease> blocks;
  blocks.emplace_back(s.pool, send.bytes());
  blocks.emplace_back(s.pool, recv.bytes());
  char* hs = blocks[0].data();
  char* hr = blocks[1].data();
  s.copy_in(hs, send.data, send.bytes());
  s.sync();
  const TensorView sv{hs, send.count, send.dtype}, rv{hr, recv.count, recv.dtype};
  s.run(blocking, std::move(blocks), recv.data, hr, recv.bytes(),
        [&] { s.host->reduce_scatter(sv, rv, op); }, [&] { return s.host->ireduce_scatter(sv, rv, op); });
  return handle_for(sp, blocking);
}

CommWork staged_reduce_scatter_in_place(const std::shared_ptr<StagedComm::State>& sp, TensorView buf,
                                        std::span<const std::size_t> counts, ReduceOp op) {
  StagedComm::State& s = *sp;
  const int rank = s.host->rank();
  const std::size_t own = in_place_block_offset(counts, s.host->size(), rank, buf.count, "StagedComm");
  const std::size_t es = dtype_size(buf.dtype);
  std::vector<Lease> blocks = stage_whole(s, buf);
  char* h = blocks[0].data();
  const TensorView hv{h, buf.count, buf.dtype};
  // Only this rank's block comes back to the device: the rest is unspecified anyway.
  s.run(false, std::move(blocks), static_cast<char*>(buf.data) + own * es, h + own * es, counts[rank] * es,
        [] {}, [&] { return s.host->ireduce_scatter_in_place(hv, counts, op); });
  return handle_for(sp, false);
}

CommWork staged_all_gather(const std::shared_ptr<StagedComm::State>& sp, TensorView send, TensorView recv,
                           bool blocking) {
  StagedComm::State& s = *sp;
  const int rank = s.host->rank();
  check_ag(send, recv, s.host->size());
  s.use_device();
  // In place (send is this rank's block of recv, as the engine's gathers are): the staging is
  // in place too, so the host communicator takes its in-place path.
  const std::size_t own = static_cast<std::size_t>(rank) * send.bytes();
  const bool in_place = send.data == static_cast<char*>(recv.data) + own;
  std::vector<Lease> blocks;
  blocks.emplace_back(s.pool, recv.bytes());
  char* hr = blocks[0].data();
  char* hs = hr + own;
  if (!in_place) {
    blocks.emplace_back(s.pool, send.bytes());
    hs = blocks[1].data();
  }
  s.copy_in(hs, send.data, send.bytes());
  s.sync();
  const TensorView sv{hs, send.count, send.dtype}, rv{hr, recv.count, recv.dtype};
  s.run(blocking, std::move(blocks), recv.data, hr, recv.bytes(), [&] { s.host->all_gather(sv, rv); },
        [&] { return s.host->iall_gather(sv, rv); });
  return handle_for(sp, blocking);
}

}  // namespace

void StagedComm::all_reduce(TensorView buf, ReduceOp op) { staged_all_reduce(state_, buf, op, true); }
CommWork StagedComm::iall_reduce(TensorView buf, ReduceOp op) { return staged_all_reduce(state_, buf, op, false); }
void StagedComm::reduce_scatter(TensorView s, TensorView r, ReduceOp op) {
  staged_reduce_scatter(state_, s, r, op, true);
}
CommWork StagedComm::ireduce_scatter(TensorView s, TensorView r, ReduceOp op) {
  return staged_reduce_scatter(state_, s, r, op, false);
}
CommWork StagedComm::ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) {
  return staged_reduce_scatter_in_place(state_, buf, counts, op);
}
void StagedComm::all_gather(TensorView s, TensorView r) { staged_all_gather(state_, s, r, true); }
CommWork StagedComm::iall_gather(TensorView s, TensorView r) { return staged_all_gather(state_, s, r, false); }

void StagedComm::broadcast(TensorView buf, int root) {
  State& s = *state_;
  if (root < 0 || root >= s.host->size())
    DS_THROW("StagedComm::broadcast: root " << root << " is not a rank (size " << s.host->size() << ")");
  s.use_device();
  Lease block(s.pool, buf.bytes());
  const bool is_root = s.host->rank() == root;
  if (is_root) {
    s.copy_in(block.data(), buf.data, buf.bytes());
    s.sync();
  }
  s.host->broadcast({block.data(), buf.count, buf.dtype}, root);
  if (!is_root) {
    s.copy_out(buf.data, block.data(), buf.bytes());
    s.sync();
  }
}

void StagedComm::barrier() { state_->host->barrier(); }

#else  // no CUDA in this build

struct StagedComm::State {};

StagedComm::StagedComm(MPI_Comm, int, std::shared_ptr<detail::MpiRuntime>) {
  DS_THROW("StagedComm: dstrain was built without CUDA (DS_WITH_CUDA), so there are no device buffers to stage; "
           "use the \"mpi\" backend for host memory");
}
StagedComm::~StagedComm() = default;
// Unreachable: no StagedComm exists in a build without CUDA.
int StagedComm::rank() const { return 0; }
int StagedComm::size() const { return 1; }
void StagedComm::set_compute_stream(void*) {}
void StagedComm::all_reduce(TensorView, ReduceOp) {}
CommWork StagedComm::iall_reduce(TensorView, ReduceOp) { return nullptr; }
void StagedComm::reduce_scatter(TensorView, TensorView, ReduceOp) {}
CommWork StagedComm::ireduce_scatter(TensorView, TensorView, ReduceOp) { return nullptr; }
CommWork StagedComm::ireduce_scatter_in_place(TensorView, std::span<const std::size_t>, ReduceOp) { return nullptr; }
void StagedComm::all_gather(TensorView, TensorView) {}
CommWork StagedComm::iall_gather(TensorView, TensorView) { return nullptr; }
void StagedComm::broadcast(TensorView, int) {}
void StagedComm::barrier() {}
void StagedComm::set_timeout(double) {}
double StagedComm::timeout() const { return 0; }
void StagedComm::set_paths(const CommPaths&) {}

#endif

}  // namespace ds
