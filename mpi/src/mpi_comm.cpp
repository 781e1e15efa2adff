// MpiComm: MPI collectives on host memory plus the shared-memory fast path (mpi_comm.h).
// This file is the dispatch: each public call checks its arguments, takes its sequence number
// for the deadline, and picks the window or plain MPI; the paths live in the files
// mpi_comm_impl.h lists.
#include "ds/mpi/mpi_comm.h"

#include <climits>
#include <cstdint>

#include "ds/core/env.h"
#include "ds/core/error.h"
#include "mpi_comm_impl.h"
#include "mpi_types.h"

namespace ds {

using detail::check_op;
using detail::divide;
using detail::DoneHandle;
using detail::mptr;
using detail::ptr;
using detail::RequestHandle;

MpiCommOptions MpiCommOptions::from_env() {
  MpiCommOptions o;
  o.shm = env::get_bool("DS_COMM_SHM");
  o.progress_thread = env::get_bool("DS_COMM_PROGRESS_THREAD");
  o.ranks_per_node = static_cast<int>(env::get_int("DS_COMM_RANKS_PER_NODE"));
  if (env::is_set("DS_COMM_OVERSUBSCRIBED")) o.oversubscribed = env::get_bool("DS_COMM_OVERSUBSCRIBED") ? 1 : 0;
  if (const auto t = detail::comm_timeout_from_env()) {
    o.timeout_s = *t;
    o.timeout_from_env = true;
  }
  return o;
}

namespace {
bool overlap(const TensorView& a, const TensorView& b) {
  auto a0 = reinterpret_cast<std::uintptr_t>(a.data), b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a.bytes() && b.bytes() && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}
void check_view(const TensorView& v, const char* what, const char* which) {
  if (v.count > 0 && v.data == nullptr) DS_THROW("MpiComm::" << what << ": " << which << " has " << v.count << " elements but no data");
}
}  // namespace

MpiComm::MpiComm(MPI_Comm comm, MpiCommOptions options, std::shared_ptr<detail::MpiRuntime> runtime)
    : impl_(std::make_unique<Impl>()) {
  if (options.max_count == 0 || options.max_count > static_cast<std::size_t>(INT_MAX))
    DS_THROW("MpiCommOptions::max_count must be in 1.." << INT_MAX << ", got " << options.max_count);
  impl_->opt = options;
  impl_->runtime = std::move(runtime);
  impl_->setup(comm);
}

MpiComm::~MpiComm() = default;

int MpiComm::rank() const { return impl_->rank; }
int MpiComm::size() const { return impl_->size; }
bool MpiComm::shm_enabled() const { return impl_->shm_on(); }
bool MpiComm::shm_all_reduce_for(std::size_t bytes, bool nonblocking) const {
  return impl_->use_shm_allreduce(bytes, nonblocking);
}
bool MpiComm::shm_reduce_scatter_for(std::size_t bytes, bool nonblocking) const {
  return impl_->use_shm_reduce_scatter(bytes, nonblocking);
}
bool MpiComm::shm_all_gather_for(std::size_t bytes, bool nonblocking, bool in_place) const {
  return impl_->use_shm_all_gather(bytes, nonblocking, in_place);
}
bool MpiComm::oversubscribed() const { return impl_->oversub; }
int MpiComm::node_size() const { return impl_->node_size; }
int MpiComm::num_nodes() const { return impl_->nnodes; }
bool MpiComm::uses_progress_thread() const { return impl_->threaded(); }
MPI_Comm MpiComm::mpi_comm() const { return impl_->comm; }

std::shared_ptr<MpiComm> MpiComm::split(int color, int key) const {
  MPI_Comm part = MPI_COMM_NULL;
  DS_MPI_CHECK(MPI_Comm_split(impl_->comm, color, key, &part));
  auto out = std::make_shared<MpiComm>(part, impl_->opt, impl_->runtime);  // keeps its own duplicate
  DS_MPI_CHECK(MPI_Comm_free(&part));
  return out;
}
const MpiCommOptions& MpiComm::options() const { return impl_->opt; }

namespace {
void check_rs(const TensorView& send, const TensorView& recv, int size) {
  check_view(send, "reduce_scatter", "send");
  check_view(recv, "reduce_scatter", "recv");
  if (send.dtype != recv.dtype)
    DS_THROW("MpiComm::reduce_scatter: send dtype " << dtype_name(send.dtype) << " differs from recv dtype " << dtype_name(recv.dtype));
  if (send.count != recv.count * static_cast<std::size_t>(size))
    DS_THROW("MpiComm::reduce_scatter: send.count (" << send.count << ") must equal recv.count (" << recv.count
             << ") * size (" << size << ")");
  if (overlap(send, recv)) DS_THROW("MpiComm::reduce_scatter: send and recv buffers overlap");
}
void check_ag(const TensorView& send, const TensorView& recv, int size, int rank) {
  check_view(send, "all_gather", "send");
  check_view(recv, "all_gather", "recv");
  if (send.dtype != recv.dtype)
    DS_THROW("MpiComm::all_gather: send dtype " << dtype_name(send.dtype) << " differs from recv dtype " << dtype_name(recv.dtype));
  if (recv.count != send.count * static_cast<std::size_t>(size))
    DS_THROW("MpiComm::all_gather: recv.count (" << recv.count << ") must equal send.count (" << send.count
             << ") * size (" << size << ")");
  const bool in_place = send.data == ptr(recv, rank * send.count);
  if (!in_place && overlap(send, recv))
    DS_THROW("MpiComm::all_gather: send overlaps recv without being exactly this rank's block (the in-place form)");
}
}  // namespace

void MpiComm::all_reduce(TensorView buf, ReduceOp op) {
  check_op(op, buf.dtype, "all_reduce");
  check_view(buf, "all_reduce", "buf");
  if (buf.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "all_reduce", impl_->arrive());
  if (impl_->use_shm_allreduce(buf.bytes(), false)) {
    impl_->drain();
    impl_->shm_all_reduce(buf, op);
  } else {
    impl_->mpi_all_reduce(buf, op, nullptr);
  }
}

CommWork MpiComm::iall_reduce(TensorView buf, ReduceOp op) {
  check_op(op, buf.dtype, "iall_reduce");
  check_view(buf, "iall_reduce", "buf");
  if (buf.count == 0) return std::make_unique<DoneHandle>();
  const std::uint64_t seq = impl_->arrive();
  if (impl_->use_shm_allreduce(buf.bytes(), true))
    return impl_->submit([this, buf, op] { impl_->shm_all_reduce(buf, op); }, "iall_reduce", seq);
  std::vector<MPI_Request> reqs;
  impl_->mpi_all_reduce(buf, op, &reqs);
  std::function<void()> after;
  if (op == ReduceOp::Avg) after = [buf, n = size()] { divide(buf.data, buf.count, buf.dtype, n); };
  return std::make_unique<RequestHandle>(std::move(reqs), std::move(after), impl_->tag("iall_reduce", seq));
}

void MpiComm::reduce_scatter(TensorView send, TensorView recv, ReduceOp op) {
  check_op(op, send.dtype, "reduce_scatter");
  check_rs(send, recv, size());
  if (recv.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "reduce_scatter", impl_->arrive());
  if (impl_->use_shm_reduce_scatter(send.bytes(), false)) {
    impl_->drain();
    impl_->shm_reduce_scatter(send, recv, op);
  } else {
    impl_->mpi_reduce_scatter(send, recv, op, nullptr);
  }
}

CommWork MpiComm::ireduce_scatter(TensorView send, TensorView recv, ReduceOp op) {
  check_op(op, send.dtype, "ireduce_scatter");
  check_rs(send, recv, size());
  if (recv.count == 0) return std::make_unique<DoneHandle>();
  const std::uint64_t seq = impl_->arrive();
  if (impl_->use_shm_reduce_scatter(send.bytes(), true))
    return impl_->submit([this, send, recv, op] { impl_->shm_reduce_scatter(send, recv, op); }, "ireduce_scatter", seq);
  std::vector<MPI_Request> reqs;
  impl_->mpi_reduce_scatter(send, recv, op, &reqs);
  std::function<void()> after;
  if (op == ReduceOp::Avg) after = [recv, n = size()] { divide(recv.data, recv.count, recv.dtype, n); };
  return std::make_unique<RequestHandle>(std::move(reqs), std::move(after), impl_->tag("ireduce_scatter", seq));
}

namespace {
// The block layout of ireduce_scatter_in_place, checked; returns each block's element offset.
std::vector<std::size_t> check_rs_in_place(const TensorView& buf, std::span<const std::size_t> counts, int size) {
  check_view(buf, "reduce_scatter_in_place", "buf");
  in_place_block_offset(counts, size, 0, buf.count, "MpiComm");
  std::vector<std::size_t> offs(counts.size());
  for (std::size_t r = 1; r < counts.size(); ++r) offs[r] = offs[r - 1] + counts[r - 1];
  return offs;
}
}  // namespace

CommWork MpiComm::ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) {
  check_op(op, buf.dtype, "ireduce_scatter_in_place");
  std::vector<std::size_t> offs = check_rs_in_place(buf, counts, size());
  if (buf.count == 0) return std::make_unique<DoneHandle>();
  const std::uint64_t seq = impl_->arrive();
  if (impl_->use_shm_reduce_scatter(buf.bytes(), true)) {
    std::vector<std::size_t> cnt(counts.begin(), counts.end());
    void* out = mptr(buf, offs[rank()]);
    return impl_->submit([this, buf, offs = std::move(offs), cnt = std::move(cnt), out, op] {
      impl_->shm_reduce_scatter_blocks(buf.data, offs, cnt, out, buf.dtype, op);
    }, "ireduce_scatter_in_place", seq);
  }
  std::vector<MPI_Request> reqs;
  std::function<void()> after = impl_->mpi_reduce_scatter_in_place(buf, counts, op, &reqs);
  return std::make_unique<RequestHandle>(std::move(reqs), std::move(after), impl_->tag("ireduce_scatter_in_place", seq));
}

void MpiComm::all_gather(TensorView send, TensorView recv) {
  check_ag(send, recv, size(), rank());
  if (send.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "all_gather", impl_->arrive());
  if (impl_->use_shm_all_gather(recv.bytes(), false, send.data == ptr(recv, rank() * send.count))) {
    impl_->drain();
    impl_->shm_all_gather(send, recv);
  } else {
    impl_->mpi_all_gather(send, recv, nullptr);
  }
}

CommWork MpiComm::iall_gather(TensorView send, TensorView recv) {
  check_ag(send, recv, size(), rank());
  if (send.count == 0) return std::make_unique<DoneHandle>();
  const std::uint64_t seq = impl_->arrive();
  if (impl_->use_shm_all_gather(recv.bytes(), true, send.data == ptr(recv, rank() * send.count)))
    return impl_->submit([this, send, recv] { impl_->shm_all_gather(send, recv); }, "iall_gather", seq);
  std::vector<MPI_Request> reqs;
  impl_->mpi_all_gather(send, recv, &reqs);
  return std::make_unique<RequestHandle>(std::move(reqs), nullptr, impl_->tag("iall_gather", seq));
}

void MpiComm::broadcast(TensorView buf, int root) {
  check_view(buf, "broadcast", "buf");
  if (root < 0 || root >= size()) DS_THROW("MpiComm::broadcast: root " << root << " is not a rank of this communicator (size " << size() << ")");
  const MPI_Datatype t = mpi_datatype(buf.dtype);
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "broadcast", impl_->arrive());
  for (std::size_t off = 0; off < buf.count; off += impl_->opt.max_count) {
    const int k = static_cast<int>(std::min(impl_->opt.max_count, buf.count - off));
    DS_MPI_CHECK(MPI_Bcast(mptr(buf, off), k, t, root, impl_->comm));
  }
}

void MpiComm::barrier() {
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "barrier", impl_->arrive());
  DS_MPI_CHECK(MPI_Barrier(impl_->comm));
}

void MpiComm::set_timeout(double seconds) {
  if (impl_->opt.timeout_from_env) return;  // DS_COMM_TIMEOUT wins over the config
  impl_->opt.timeout_s = seconds > 0 ? seconds : 0;
  impl_->watchdog->set_timeout(impl_->opt.timeout_s);
}

double MpiComm::timeout() const { return impl_->opt.timeout_s; }

void MpiComm::set_paths(const CommPaths& paths) {
  impl_->drain();  // nothing of the progress thread is in flight while the options change
  // DS_COMM_SHM / DS_COMM_PROGRESS_THREAD (debug overrides, read at construction) win.
  if (!env::is_set("DS_COMM_SHM")) impl_->opt.shm = impl_->opt.shm && paths.shared_memory;
  if (!env::is_set("DS_COMM_PROGRESS_THREAD"))
    impl_->opt.progress_thread = impl_->opt.progress_thread && paths.progress_thread;
}

void MpiComm::all_reduce_mpi(TensorView buf, ReduceOp op) {
  check_op(op, buf.dtype, "all_reduce");
  check_view(buf, "all_reduce", "buf");
  if (buf.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "all_reduce", impl_->arrive());
  impl_->mpi_all_reduce(buf, op, nullptr);
}

void MpiComm::reduce_scatter_mpi(TensorView send, TensorView recv, ReduceOp op) {
  check_op(op, send.dtype, "reduce_scatter");
  check_rs(send, recv, size());
  if (recv.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "reduce_scatter", impl_->arrive());
  impl_->mpi_reduce_scatter(send, recv, op, nullptr);
}

void MpiComm::reduce_scatter_in_place_mpi(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) {
  check_op(op, buf.dtype, "reduce_scatter_in_place");
  check_rs_in_place(buf, counts, size());
  if (buf.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "reduce_scatter_in_place", impl_->arrive());
  impl_->mpi_reduce_scatter_in_place(buf, counts, op, nullptr);
}

void MpiComm::all_gather_mpi(TensorView send, TensorView recv) {
  check_ag(send, recv, size(), rank());
  if (send.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "all_gather", impl_->arrive());
  impl_->mpi_all_gather(send, recv, nullptr);
}

}  // namespace ds