// NcclComm: NCCL collectives on device memory, bootstrapped over MPI (nccl_comm.h).
#include "ds/mpi/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "check.h"
#include "comm_watchdog.h"

// DS_NCCL_CHECK: the check macro for NCCL calls; names the call, device and NCCL's text.
#define DS_NCCL_CHECK(call)                                                                \
  do {                                                                                     \
    ncclResult_t ds_nccl_rc_ = (call);                                                     \
    if (ds_nccl_rc_ != ncclSuccess) {                                                      \
      int ds_dev_ = -1;                                                                    \
      cudaGetDevice(&ds_dev_);                                                             \
      DS_THROW("NCCL call " #call " failed on device " << ds_dev_ << ": "                \
               << ncclGetErrorString(ds_nccl_rc_) << " (" << int(ds_nccl_rc_) << ")");   \
    }                                                                                      \
  } while (0)

namespace ds {

namespace {

ncclDataType_t nccl_type(DType t, const char* what) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  DS_THROW("NcclComm::" << what << ": unsupported dtype #" << int(t));
}

ncclRedOp_t nccl_op(ReduceOp op, DType t, const char* what) {
  if (t == DType::U8)
    DS_THROW("NcclComm::" << what << ": op " << reduce_op_name(op) << " is not supported for dtype " << dtype_name(t));
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
  }
  DS_THROW("NcclComm::" << what << ": unsupported reduce op #" << int(op) << " with dtype " << dtype_name(t));
}

class EventHandle final : public CommHandle {
 public:
  EventHandle(cudaEvent_t ev, cudaStream_t compute, detail::CommWatchdog* watchdog, const char* what,
              std::uint64_t seq)
      : ev_(ev), compute_(compute), watchdog_(watchdog), what_(what), seq_(seq) {}
  ~EventHandle() override {
    if (ev_) {
      cudaEventSynchronize(ev_);
      cudaEventDestroy(ev_);
    }
  }
  void wait() override {
    if (!ev_) return;
    DS_CUDA_CHECK(cudaStreamWaitEvent(compute_, ev_, 0));
    {
      detail::CommWait w(*watchdog_, detail::CommWatchdog::kCaller, what_, seq_);
      DS_CUDA_CHECK(cudaEventSynchronize(ev_));
    }
    cudaEventDestroy(ev_);
    ev_ = nullptr;
  }
  void order_stream(void* stream) override {
    if (ev_) DS_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev_, 0));
  }
  bool test() override {
    if (!ev_) return true;
    cudaError_t rc = cudaEventQuery(ev_);
    if (rc == cudaErrorNotReady) return false;
    DS_CUDA_CHECK(rc);
    wait();
    return true;
  }

 private:
  cudaEvent_t ev_;
  cudaStream_t compute_;
  detail::CommWatchdog* watchdog_;  // the communicator's; outlives its handles
  const char* what_;
  std::uint64_t seq_;
};

}  // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaStream_t compute = nullptr;
  cudaEvent_t ready = nullptr;  // recorded on the compute stream before each operation
  int rank = 0, size = 1, device = 0;
  bool failed = false;
  std::uint64_t seq = 0;  // collectives issued so far (for the timeout's message)
  bool timeout_from_env = false;
  std::unique_ptr<detail::CommWatchdog> watchdog;

  // Orders the comm stream after the compute stream's work so far.
  void order_after_compute() {
    DS_CUDA_CHECK(cudaEventRecord(ready, compute));
    DS_CUDA_CHECK(cudaStreamWaitEvent(stream, ready, 0));
  }

  template <typename F>
  void guarded(F&& f) {
    try {
      DS_CUDA_CHECK(cudaSetDevice(device));
      f();
      ncclResult_t async = ncclSuccess;
      DS_NCCL_CHECK(ncclCommGetAsyncError(comm, &async));
      DS_NCCL_CHECK(async);
    } catch (...) {
      if (!failed && comm) ncclCommAbort(comm);
      failed = true;
      throw;
    }
  }

  void check_alive(const char* what) const {
    if (failed) DS_THROW("NcclComm::" << what << ": the communicator was aborted after an earlier error");
  }

  // `what`: a string literal naming the collective (the watchdog reads it later).
  CommWork finish(bool blocking, const char* what) {
    const std::uint64_t n = ++seq;
    if (blocking) {
      detail::CommWait w(*watchdog, detail::CommWatchdog::kCaller, what, n);
      DS_CUDA_CHECK(cudaStreamSynchronize(stream));
      return nullptr;
    }
    cudaEvent_t ev = nullptr;
    DS_CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    DS_CUDA_CHECK(cudaEventRecord(ev, stream));
    return std::make_unique<EventHandle>(ev, compute, watchdog.get(), what, n);
  }
};

NcclComm::NcclComm(MPI_Comm comm, int device) : impl_(std::make_unique<Impl>()) {
  DS_MPI_CHECK(MPI_Comm_rank(comm, &impl_->rank));
  DS_MPI_CHECK(MPI_Comm_size(comm, &impl_->size));
  impl_->device = device;
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess || count == 0)
    DS_THROW("NcclComm: no CUDA device visible (" << (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices") << ")");
  if (device < 0 || device >= count) DS_THROW("NcclComm: device " << device << " out of range (" << count << " visible)");
  DS_CUDA_CHECK(cudaSetDevice(device));
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (impl_->rank == 0) DS_NCCL_CHECK(ncclGetUniqueId(&id));
  DS_MPI_CHECK(MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, comm));
  DS_NCCL_CHECK(ncclCommInitRank(&impl_->comm, impl_->size, id, impl_->rank));
  DS_CUDA_CHECK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
  DS_CUDA_CHECK(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming));
  impl_->watchdog = std::make_unique<detail::CommWatchdog>(impl_->rank, nullptr);
  const auto env = detail::comm_timeout_from_env();
  impl_->timeout_from_env = env.has_value();
  impl_->watchdog->set_timeout(env.value_or(1800.0));  // torch's default_pg_timeout, as MpiComm
}

void NcclComm::set_timeout(double seconds) {
  if (impl_->timeout_from_env) return;  // DS_COMM_TIMEOUT wins over the config
  impl_->watchdog->set_timeout(seconds);
}

NcclComm::~NcclComm() {
  if (!impl_) return;
  if (impl_->watchdog) impl_->watchdog->shutdown();
  if (impl_->comm) {
    if (impl_->failed) {
      // already aborted
    } else {
      cudaStreamSynchronize(impl_->stream);
      ncclCommDestroy(impl_->comm);
    }
  }
  if (impl_->ready) cudaEventDestroy(impl_->ready);
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

int NcclComm::rank() const { return impl_->rank; }
int NcclComm::size() const { return impl_->size; }
void NcclComm::set_compute_stream(void* s) { impl_->compute = static_cast<cudaStream_t>(s); }
void* NcclComm::stream() const { return impl_->stream; }

namespace {
void nccl_check_rs(const TensorView& send, const TensorView& recv, int size) {
  if (send.dtype != recv.dtype) DS_THROW("NcclComm::reduce_scatter: send dtype " << dtype_name(send.dtype) << " differs from recv dtype " << dtype_name(recv.dtype));
  if (send.count != recv.count * static_cast<std::size_t>(size))
    DS_THROW("NcclComm::reduce_scatter: send.count (" << send.count << ") must equal recv.count (" << recv.count << ") * size (" << size << ")");
}
void nccl_check_ag(const TensorView& send, const TensorView& recv, int size) {
  if (send.dtype != recv.dtype) DS_THROW("NcclComm::all_gather: send dtype " << dtype_name(send.dtype) << " differs from recv dtype " << dtype_name(recv.dtype));
  if (recv.count != send.count * static_cast<std::size_t>(size))
    DS_THROW("NcclComm::all_gather: recv.count (" << recv.count << ") must equal send.count (" << send.count << ") * size (" << size << ")");
}
}  // namespace

static CommWork NcclComm_all_reduce(NcclComm::Impl& m, TensorView buf, ReduceOp op, bool blocking) {
  m.check_alive("all_reduce");
  const ncclRedOp_t o = nccl_op(op, buf.dtype, "all_reduce");
  const ncclDataType_t t = nccl_type(buf.dtype, "all_reduce");
  CommWork w;
  m.guarded([&] {
    m.order_after_compute();
    DS_NCCL_CHECK(ncclAllReduce(buf.data, buf.data, buf.count, t, o, m.comm, m.stream));
    w = m.finish(blocking, "all_reduce");
  });
  return w;
}

void NcclComm::all_reduce(TensorView buf, ReduceOp op) { NcclComm_all_reduce(*impl_, buf, op, true); }
CommWork NcclComm::iall_reduce(TensorView buf, ReduceOp op) { return NcclComm_all_reduce(*impl_, buf, op, false); }

static CommWork NcclComm_reduce_scatter(NcclComm::Impl& m, TensorView send, TensorView recv, ReduceOp op, bool blocking) {
  m.check_alive("reduce_scatter");
  nccl_check_rs(send, recv, m.size);
  const ncclRedOp_t o = nccl_op(op, send.dtype, "reduce_scatter");
  const ncclDataType_t t = nccl_type(send.dtype, "reduce_scatter");
  CommWork w;
  m.guarded([&] {
    m.order_after_compute();
    DS_NCCL_CHECK(ncclReduceScatter(send.data, recv.data, recv.count, t, o, m.comm, m.stream));
    w = m.finish(blocking, "reduce_scatter");
  });
  return w;
}

void NcclComm::reduce_scatter(TensorView s, TensorView r, ReduceOp op) { NcclComm_reduce_scatter(*impl_, s, r, op, true); }
CommWork NcclComm::ireduce_scatter(TensorView s, TensorView r, ReduceOp op) { return NcclComm_reduce_scatter(*impl_, s, r, op, false); }

CommWork NcclComm::ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) {
  Impl& m = *impl_;
  m.check_alive("reduce_scatter_in_place");
  in_place_block_offset(counts, m.size, m.rank, buf.count, "NcclComm");
  const ncclRedOp_t o = nccl_op(op, buf.dtype, "reduce_scatter_in_place");
  const ncclDataType_t t = nccl_type(buf.dtype, "reduce_scatter_in_place");
  const std::size_t es = dtype_size(buf.dtype);
  CommWork w;
  m.guarded([&] {
    m.order_after_compute();
    // NCCL has no variable-count reduce-scatter: the blocks' reduces in one group, each in
    // place at the rank that holds it (the other ranks' receive buffer is not used).
    DS_NCCL_CHECK(ncclGroupStart());
    std::size_t at = 0;
    for (int r = 0; r < m.size; ++r) {
      char* p = static_cast<char*>(buf.data) + at * es;
      if (counts[r] > 0) DS_NCCL_CHECK(ncclReduce(p, p, counts[r], t, o, r, m.comm, m.stream));
      at += counts[r];
    }
    DS_NCCL_CHECK(ncclGroupEnd());
    w = m.finish(false, "reduce_scatter_in_place");
  });
  return w;
}

static CommWork NcclComm_all_gather(NcclComm::Impl& m, TensorView send, TensorView recv, bool blocking) {
  m.check_alive("all_gather");
  nccl_check_ag(send, recv, m.size);
  const ncclDataType_t t = nccl_type(send.dtype, "all_gather");
  CommWork w;
  m.guarded([&] {
    m.order_after_compute();
    DS_NCCL_CHECK(ncclAllGather(send.data, recv.data, send.count, t, m.comm, m.stream));
    w = m.finish(blocking, "all_gather");
  });
  return w;
}

void NcclComm::all_gather(TensorView s, TensorView r) { NcclComm_all_gather(*impl_, s, r, true); }
CommWork NcclComm::iall_gather(TensorView s, TensorView r) { return NcclComm_all_gather(*impl_, s, r, false); }

void NcclComm::broadcast(TensorView buf, int root) {
  impl_->check_alive("broadcast");
  if (root < 0 || root >= impl_->size) DS_THROW("NcclComm::broadcast: root " << root << " is not a rank (size " << impl_->size << ")");
  const ncclDataType_t t = nccl_type(buf.dtype, "broadcast");
  impl_->guarded([&] {
    impl_->order_after_compute();
    DS_NCCL_CHECK(ncclBroadcast(buf.data, buf.data, buf.count, t, root, impl_->comm, impl_->stream));
    impl_->finish(true, "broadcast");
  });
}

void NcclComm::barrier() {
  // NCCL has no barrier: a one-element all-reduce on the device orders every rank.
  impl_->check_alive("barrier");
  impl_->guarded([&] {
    void* d = nullptr;
    DS_CUDA_CHECK(cudaMallocAsync(&d, sizeof(float), impl_->stream));
    DS_CUDA_CHECK(cudaMemsetAsync(d, 0, sizeof(float), impl_->stream));
    DS_NCCL_CHECK(ncclAllReduce(d, d, 1, ncclFloat32, ncclSum, impl_->comm, impl_->stream));
    DS_CUDA_CHECK(cudaFreeAsync(d, impl_->stream));
    impl_->finish(true, "barrier");
  });
}

}  // namespace ds
