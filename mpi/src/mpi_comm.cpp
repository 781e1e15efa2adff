// MpiComm: MPI collectives on host memory plus the shared-memory fast path (mpi_comm.h).
#include "ds/mpi/mpi_comm.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <sched.h>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "comm_watchdog.h"
#include "ds/core/half.h"
#include "ds/core/spin_wait.h"
#include "ds/mpi/check.h"
#include "ds/mpi/init.h"

namespace ds {

namespace {
// "stopped" or "gone" for a process on this node that cannot take part in a collective, ""
// when it runs (from /proc/PID/stat: T/t stopped or traced, Z zombie, X dead; no entry: gone).
std::string process_state(std::int64_t pid) {
  if (pid <= 0) return {};
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (!f) return "gone";
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // the command name may hold spaces and ')'
  if (n == 0 || !paren || paren[1] != ' ') return {};
  switch (paren[2]) {
    case 'T': case 't': return "stopped";
    case 'Z': case 'X': return "gone";
    default: return {};
  }
}
}  // namespace

// ---------------------------------------------------------------------------------------
// Datatypes and ops
// ---------------------------------------------------------------------------------------
namespace {

bool is_reducible(DType t) {
  switch (t) {
    case DType::F32: case DType::F64: case DType::F16: case DType::BF16: case DType::I32: case DType::I64:
      return true;
    default:
      return false;
  }
}

// fp16 / bf16 reductions for MPI: widen to fp32 in blocks, reduce, round back.
template <DType T, ReduceOp Op>
void half_op(void* in, void* inout, int* len, MPI_Datatype*) {
  constexpr int kBlock = 512;
  float a[kBlock], b[kBlock];
  auto* src = static_cast<std::uint16_t*>(in);
  auto* dst = static_cast<std::uint16_t*>(inout);
  for (int off = 0; off < *len; off += kBlock) {
    const int k = std::min(kBlock, *len - off);
    convert(src + off, T, a, DType::F32, k);
    convert(dst + off, T, b, DType::F32, k);
    for (int i = 0; i < k; ++i) {
      if constexpr (Op == ReduceOp::Sum) b[i] = a[i] + b[i];
      else if constexpr (Op == ReduceOp::Max) b[i] = a[i] > b[i] ? a[i] : b[i];
      else b[i] = a[i] < b[i] ? a[i] : b[i];
    }
    convert(b, DType::F32, dst + off, T, k);
  }
}

struct HalfOps {
  MPI_Datatype type = MPI_DATATYPE_NULL;  // 2 contiguous bytes
  MPI_Op ops[2][3] = {};                  // [f16, bf16][sum, max, min]
};

HalfOps& half_ops() {
  static HalfOps h = [] {
    HalfOps o;
    DS_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &o.type));
    DS_MPI_CHECK(MPI_Type_commit(&o.type));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::F16, ReduceOp::Sum>, 1, &o.ops[0][0]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::F16, ReduceOp::Max>, 1, &o.ops[0][1]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::F16, ReduceOp::Min>, 1, &o.ops[0][2]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::BF16, ReduceOp::Sum>, 1, &o.ops[1][0]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::BF16, ReduceOp::Max>, 1, &o.ops[1][1]));
    DS_MPI_CHECK(MPI_Op_create(&half_op<DType::BF16, ReduceOp::Min>, 1, &o.ops[1][2]));
    return o;
  }();
  return h;
}

void check_op(ReduceOp op, DType t, const char* what) {
  if (op != ReduceOp::Sum && op != ReduceOp::Avg && op != ReduceOp::Max && op != ReduceOp::Min)
    DS_THROW("MpiComm::" << what << ": unsupported reduce op #" << int(op) << " with dtype " << dtype_name(t));
  if (!is_reducible(t))
    DS_THROW("MpiComm::" << what << ": op " << reduce_op_name(op) << " is not supported for dtype " << dtype_name(t)
             << " by the mpi backend (supported: fp32, fp64, fp16, bf16, int32, int64)");
}

template <typename T>
void divide_typed(T* p, std::size_t n, int by) {
  const T d = static_cast<T>(by);
  for (std::size_t i = 0; i < n; ++i) p[i] = p[i] / d;
}

// avg = sum / size, applied after the sum on every path (so both paths round alike).
void divide(void* p, std::size_t n, DType t, int by) {
  if (by == 1 || n == 0) return;
  switch (t) {
    case DType::F32: divide_typed(static_cast<float*>(p), n, by); break;
    case DType::F64: divide_typed(static_cast<double*>(p), n, by); break;
    case DType::I32: divide_typed(static_cast<std::int32_t*>(p), n, by); break;
    case DType::I64: divide_typed(static_cast<std::int64_t*>(p), n, by); break;
    case DType::F16: case DType::BF16: {
      constexpr std::size_t kBlock = 1024;
      float a[kBlock];
      auto* h = static_cast<std::uint16_t*>(p);
      const float d = static_cast<float>(by);
      for (std::size_t off = 0; off < n; off += kBlock) {
        const std::size_t k = std::min(kBlock, n - off);
        convert(h + off, t, a, DType::F32, k);
        for (std::size_t i = 0; i < k; ++i) a[i] = a[i] / d;
        convert(a, DType::F32, h + off, t, k);
      }
      break;
    }
    default: DS_THROW("avg is not supported for dtype " << dtype_name(t));
  }
}

// ---- shm reduction kernels: dst[i] = op over r of srcs[r][i], in rank order ----

template <typename T>
inline T apply(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::Max: return b > a ? b : a;
    case ReduceOp::Min: return b < a ? b : a;
    default: return a + b;
  }
}

template <typename T, ReduceOp Op>
void reduce_block_typed(T* __restrict acc, const T* __restrict src, std::size_t k) {
  if constexpr (Op == ReduceOp::Max) {
#pragma omp simd
    for (std::size_t i = 0; i < k; ++i) acc[i] = src[i] > acc[i] ? src[i] : acc[i];
  } else if constexpr (Op == ReduceOp::Min) {
#pragma omp simd
    for (std::size_t i = 0; i < k; ++i) acc[i] = src[i] < acc[i] ? src[i] : acc[i];
  } else {
#pragma omp simd
    for (std::size_t i = 0; i < k; ++i) acc[i] = acc[i] + src[i];
  }
}

// dst2 (optional): a second copy of the result, written from the same L1-resident block (one
// pass over the sources for two outputs). dst / dst2 may equal a source: a block is read in
// full before it is written.
template <typename T, ReduceOp Op>
void reduce_slices_typed(void* dst, void* dst2, const std::vector<const char*>& srcs, std::size_t n) {
  constexpr std::size_t kBlock = 4096 / sizeof(T) * 4;  // 16 KiB accumulator, stays in L1
  alignas(64) T acc[kBlock];
  T* out = static_cast<T*>(dst);
  T* out2 = static_cast<T*>(dst2);
  for (std::size_t off = 0; off < n; off += kBlock) {
    const std::size_t k = std::min(kBlock, n - off);
    std::memcpy(acc, reinterpret_cast<const T*>(srcs[0]) + off, k * sizeof(T));
    for (std::size_t r = 1; r < srcs.size(); ++r)
      reduce_block_typed<T, Op>(acc, reinterpret_cast<const T*>(srcs[r]) + off, k);
    std::memcpy(out + off, acc, k * sizeof(T));
    if (out2) std::memcpy(out2 + off, acc, k * sizeof(T));
  }
}

template <ReduceOp Op>
void reduce_slices_half(void* dst, void* dst2, const std::vector<const char*>& srcs, std::size_t n, DType t) {
  constexpr std::size_t kBlock = 2048;
  alignas(64) float acc[kBlock];
  alignas(64) float tmp[kBlock];
  alignas(64) std::uint16_t rounded[kBlock];
  auto* out = static_cast<std::uint16_t*>(dst);
  for (std::size_t off = 0; off < n; off += kBlock) {
    const std::size_t k = std::min(kBlock, n - off);
    convert(reinterpret_cast<const std::uint16_t*>(srcs[0]) + off, t, acc, DType::F32, k);
    for (std::size_t r = 1; r < srcs.size(); ++r) {
      convert(reinterpret_cast<const std::uint16_t*>(srcs[r]) + off, t, tmp, DType::F32, k);
      if constexpr (Op == ReduceOp::Sum) {
        // Round after every addition, as the MPI user op does, so both paths agree bit for bit.
        for (std::size_t i = 0; i < k; ++i) acc[i] = acc[i] + tmp[i];
        if (r + 1 < srcs.size()) {  // through a scratch: dst may be one of the sources
          convert(acc, DType::F32, rounded, t, k);
          convert(rounded, t, acc, DType::F32, k);
        }
      } else {
        reduce_block_typed<float, Op>(acc, tmp, k);
      }
    }
    convert(acc, DType::F32, out + off, t, k);
    if (dst2) std::memcpy(static_cast<std::uint16_t*>(dst2) + off, out + off, k * sizeof(std::uint16_t));
  }
}

template <ReduceOp Op>
void reduce_slices_op(void* dst, void* dst2, const std::vector<const char*>& srcs, std::size_t n, DType t) {
  switch (t) {
    case DType::F32: reduce_slices_typed<float, Op>(dst, dst2, srcs, n); break;
    case DType::F64: reduce_slices_typed<double, Op>(dst, dst2, srcs, n); break;
    case DType::I32: reduce_slices_typed<std::int32_t, Op>(dst, dst2, srcs, n); break;
    case DType::I64: reduce_slices_typed<std::int64_t, Op>(dst, dst2, srcs, n); break;
    case DType::F16: case DType::BF16: reduce_slices_half<Op>(dst, dst2, srcs, n, t); break;
    default: DS_THROW("shm reduction: unsupported dtype " << dtype_name(t));
  }
}

// Sum for avg too (the division comes afterwards).
void reduce_slices(void* dst, const std::vector<const char*>& srcs, std::size_t n, DType t, ReduceOp op,
                   void* dst2 = nullptr) {
  if (n == 0) return;
  switch (op) {
    case ReduceOp::Max: reduce_slices_op<ReduceOp::Max>(dst, dst2, srcs, n, t); break;
    case ReduceOp::Min: reduce_slices_op<ReduceOp::Min>(dst, dst2, srcs, n, t); break;
    default: reduce_slices_op<ReduceOp::Sum>(dst, dst2, srcs, n, t); break;
  }
}

// dst = dst2 = src, reading src once (16 KiB blocks: the second copy reads the first from L1).
void copy2(void* dst, void* dst2, const void* src, std::size_t bytes) {
  constexpr std::size_t kBlock = 16384;
  auto* d = static_cast<char*>(dst);
  auto* d2 = static_cast<char*>(dst2);
  auto* s = static_cast<const char*>(src);
  for (std::size_t off = 0; off < bytes; off += kBlock) {
    const std::size_t k = std::min(kBlock, bytes - off);
    std::memcpy(d + off, s + off, k);
    std::memcpy(d2 + off, d + off, k);
  }
}

std::size_t env_size(const char* name, std::size_t def) {
  const char* v = std::getenv(name);
  if (!v || !*v) return def;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  if (end == v) DS_THROW("environment variable " << name << "='" << v << "' is not a number");
  if (*end == 'K' || *end == 'k') x <<= 10;
  else if (*end == 'M' || *end == 'm') x <<= 20;
  else if (*end != '\0') DS_THROW("environment variable " << name << "='" << v << "' is not a size (N, NK or NM)");
  return static_cast<std::size_t>(x);
}

// NAME=FROM:BELOW (sizes as env_size reads them); unset leaves `band` alone.
void env_band(const char* name, SizeBand& band) {
  const char* v = std::getenv(name);
  if (!v || !*v) return;
  const std::string s(v);
  const auto colon = s.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    DS_THROW("environment variable " << name << "='" << v << "' must be FROM:BELOW (sizes like 128K:16M; 0:0 for none)");
  auto part = [&](const std::string& p) {
    char* end = nullptr;
    unsigned long long x = std::strtoull(p.c_str(), &end, 10);
    if (end == p.c_str()) DS_THROW("environment variable " << name << "='" << v << "': '" << p << "' is not a size");
    if (*end == 'K' || *end == 'k') x <<= 10, ++end;
    else if (*end == 'M' || *end == 'm') x <<= 20, ++end;
    if (*end != '\0') DS_THROW("environment variable " << name << "='" << v << "': '" << p << "' is not a size (N, NK or NM)");
    return static_cast<std::size_t>(x);
  };
  band = SizeBand{part(s.substr(0, colon)), part(s.substr(colon + 1))};
}

const char* ptr(const TensorView& v, std::size_t elems) { return static_cast<const char*>(v.data) + elems * dtype_size(v.dtype); }
char* mptr(const TensorView& v, std::size_t elems) { return static_cast<char*>(v.data) + elems * dtype_size(v.dtype); }

bool overlap(const TensorView& a, const TensorView& b) {
  auto a0 = reinterpret_cast<std::uintptr_t>(a.data), b0 = reinterpret_cast<std::uintptr_t>(b.data);
  return a.bytes() && b.bytes() && a0 < b0 + b.bytes() && b0 < a0 + a.bytes();
}

}  // namespace

MPI_Datatype mpi_datatype(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
    case DType::F16: case DType::BF16: return half_ops().type;
  }
  DS_THROW("no MPI datatype for dtype #" << int(t));
}

MPI_Op mpi_reduce_op(ReduceOp op, DType t) {
  check_op(op, t, "reduce");
  if (t == DType::F16 || t == DType::BF16) {
    const int k = op == ReduceOp::Max ? 1 : op == ReduceOp::Min ? 2 : 0;
    return half_ops().ops[t == DType::F16 ? 0 : 1][k];
  }
  return op == ReduceOp::Max ? MPI_MAX : op == ReduceOp::Min ? MPI_MIN : MPI_SUM;
}

MpiCommOptions MpiCommOptions::from_env() {
  MpiCommOptions o;
  o.shm = env_size("DS_COMM_SHM", 1) != 0;
  o.shm_chunk_bytes = env_size("DS_COMM_SHM_CHUNK", o.shm_chunk_bytes);
  o.shm_oneshot_max = env_size("DS_COMM_SHM_ONESHOT_MAX", o.shm_oneshot_max);
  if (const char* v = std::getenv("DS_COMM_SHM_MIN"); v && *v) o.set_shm_min(env_size("DS_COMM_SHM_MIN", 0));
  env_band("DS_COMM_PLAIN_ALL_REDUCE", o.plain_all_reduce);
  env_band("DS_COMM_PLAIN_REDUCE_SCATTER", o.plain_reduce_scatter);
  env_band("DS_COMM_PLAIN_ALL_GATHER", o.plain_all_gather);
  env_band("DS_COMM_PLAIN_ALL_GATHER_IN_PLACE", o.plain_all_gather_in_place);
  env_band("DS_COMM_PLAIN_ALL_GATHER_OVERSUBSCRIBED", o.plain_all_gather_oversubscribed);
  env_band("DS_COMM_PLAIN_ALL_REDUCE_OVERSUBSCRIBED", o.plain_all_reduce_oversubscribed);
  o.ranks_per_node = static_cast<int>(env_size("DS_COMM_RANKS_PER_NODE", 0));
  o.progress_thread = env_size("DS_COMM_PROGRESS_THREAD", 1) != 0;
  if (const char* v = std::getenv("DS_COMM_OVERSUBSCRIBED"); v && *v)
    o.oversubscribed = env_size("DS_COMM_OVERSUBSCRIBED", 0) != 0 ? 1 : 0;
  if (const char* v = std::getenv("DS_COMM_BARRIER_SPINS"); v && *v)
    o.barrier_spins = static_cast<int>(std::min<std::size_t>(env_size("DS_COMM_BARRIER_SPINS", 0), 1u << 30));
  if (const auto t = detail::comm_timeout_from_env()) {
    o.timeout_s = *t;
    o.timeout_from_env = true;
  }
  return o;
}

// ---------------------------------------------------------------------------------------
// Handles
// ---------------------------------------------------------------------------------------
namespace {

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

struct TaskState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

class TaskHandle final : public CommHandle {
 public:
  TaskHandle(std::shared_ptr<TaskState> s, OpTag tag) : s_(std::move(s)), tag_(std::move(tag)) {}
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
  OpTag tag_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Impl
// ---------------------------------------------------------------------------------------
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
  OpTag tag(const char* what, std::uint64_t seq) const { return OpTag{watchdog, what, seq}; }
  std::string not_arrived(std::uint64_t seq) const;

  ~Impl();
  void setup(MPI_Comm parent);

  // --- shm path ---
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
    return win != MPI_WIN_NULL && bytes >= opt.shm_min_all_reduce &&
           !in_plain_band(opt.plain_all_reduce, opt.plain_all_reduce_oversubscribed, bytes, nonblocking) &&
           (nnodes == 1 || uniform);
  }
  bool use_shm_reduce_scatter(std::size_t bytes, bool nonblocking) const {
    return win != MPI_WIN_NULL && nnodes == 1 && bytes >= opt.shm_min_reduce_scatter &&
           !in_plain_band(opt.plain_reduce_scatter, SizeBand{}, bytes, nonblocking);
  }
  bool use_shm_all_gather(std::size_t bytes, bool nonblocking, bool in_place) const {
    return win != MPI_WIN_NULL && nnodes == 1 && bytes >= opt.shm_min_all_gather &&
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
  void shm_all_gather(TensorView send, TensorView recv);

  // --- plain path ---
  void mpi_all_reduce(TensorView buf, ReduceOp op, std::vector<MPI_Request>* reqs);
  void mpi_reduce_scatter(TensorView send, TensorView recv, ReduceOp op, std::vector<MPI_Request>* reqs);
  void mpi_all_gather(TensorView send, TensorView recv, std::vector<MPI_Request>* reqs);

  // --- progress thread ---
  bool threaded() const { return opt.progress_thread && thread_level >= MPI_THREAD_MULTIPLE; }
  CommWork submit(std::function<void()> fn, const char* what, std::uint64_t seq);
  void drain();
  void worker_loop();
};

void MpiComm::Impl::setup(MPI_Comm parent) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) DS_THROW("MpiComm: MPI is not initialized (call ds::init_distributed() first)");
  MPI_Query_thread(&thread_level);
  DS_MPI_CHECK(MPI_Comm_dup(parent, &comm));
  DS_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  DS_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DS_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (opt.ranks_per_node > 0) {
    DS_MPI_CHECK(MPI_Comm_split(comm, rank / opt.ranks_per_node, rank, &node));
  } else {
    DS_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  }
  DS_MPI_CHECK(MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN));
  DS_MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  DS_MPI_CHECK(MPI_Comm_size(node, &node_size));
  int leader = node_rank == 0 ? 1 : 0;
  DS_MPI_CHECK(MPI_Allreduce(&leader, &nnodes, 1, MPI_INT, MPI_SUM, comm));
  int mm[2] = {node_size, -node_size}, out[2] = {0, 0};
  DS_MPI_CHECK(MPI_Allreduce(mm, out, 2, MPI_INT, MPI_MAX, comm));
  uniform = out[0] == -out[1];
  DS_MPI_CHECK(MPI_Comm_split(comm, node_rank, rank, &cross));
  DS_MPI_CHECK(MPI_Comm_set_errhandler(cross, MPI_ERRORS_RETURN));
  {
    // CPUs the node's ranks may run on: the union of their affinity masks (the same answer on
    // every rank of the node; a group of consecutive ranks counts as a node for this too).
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);
    cpu_set_t all;
    DS_MPI_CHECK(MPI_Allreduce(&set, &all, static_cast<int>(sizeof set), MPI_BYTE, MPI_BOR, node));
    const int cpus = CPU_COUNT(&all);
    oversub = opt.oversubscribed >= 0 ? opt.oversubscribed > 0 : cpus > 0 && node_size > cpus;
    // Oversubscribed, a peer that has not arrived is usually waiting for this very CPU: yield
    // almost at once (measured: 4 ranks on 2 CPUs, 4-32 KiB all_reduce 2x faster than with 256).
    spin_limit = opt.barrier_spins >= 0 ? opt.barrier_spins : oversub ? 4 : 256;
  }

  // All ranks decide alike whether to build the window (it is collective over `node`).
  if (opt.shm && node_size > 1) {
    half_bytes = std::max<std::size_t>(opt.shm_chunk_bytes / 64 * 64, 4096);
    MPI_Info info;
    DS_MPI_CHECK(MPI_Info_create(&info));
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    char* base = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(kCtrlBytes + 2 * half_bytes), 1, info, node, &base, &win);
    MPI_Info_free(&info);
    DS_MPI_CHECK(rc);
    DS_MPI_CHECK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
    seg.resize(node_size);
    ctrl.resize(node_size);
    for (int r = 0; r < node_size; ++r) {
      MPI_Aint sz = 0;
      int disp = 0;
      DS_MPI_CHECK(MPI_Win_shared_query(win, r, &sz, &disp, &ctrl[r]));
      seg[r] = ctrl[r] + kCtrlBytes;
    }
    std::memset(base, 0, kCtrlBytes + 2 * half_bytes);  // first touch once, here, not in the first step
    *reinterpret_cast<std::int64_t*>(base + kRankOffset) = rank;
    *reinterpret_cast<std::int64_t*>(base + kPidOffset) = static_cast<std::int64_t>(getpid());
    DS_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
    DS_MPI_CHECK(MPI_Win_sync(win));
    DS_MPI_CHECK(MPI_Barrier(node));  // every counter is zero before anyone uses the window
  }
  watchdog = std::make_shared<detail::CommWatchdog>(rank, [this](std::uint64_t seq) { return not_arrived(seq); });
  watchdog->set_timeout(opt.timeout_s);
}

// Called on the watchdog thread once, at a timeout: the node peers whose published sequence
// number is below `seq` have not called that collective (ranks on other nodes are not known).
std::string MpiComm::Impl::not_arrived(std::uint64_t seq) const {
  if (win == MPI_WIN_NULL) {
    return size == 1 ? std::string() : "which ranks did not arrive is not known (no shared-memory window)";
  }
  std::string late, stuck;
  for (int r = 0; r < node_size; ++r) {
    if (r == node_rank) continue;
    const std::uint64_t got =
        std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(ctrl[r] + kArrivedOffset))
            .load(std::memory_order_acquire);
    const std::string who = std::to_string(*reinterpret_cast<const std::int64_t*>(ctrl[r] + kRankOffset));
    if (got < seq) {
      late += late.empty() ? "" : ", ";
      late += who + " (at #" + std::to_string(got) + ")";
      continue;
    }
    // Arrived, yet the collective did not finish: a peer stopped inside it (SIGSTOP, a
    // debugger) or gone leaves its part undone. Its process state says which.
    const auto pid = *reinterpret_cast<const std::int64_t*>(ctrl[r] + kPidOffset);
    const std::string state = process_state(pid);
    if (!state.empty()) {
      stuck += stuck.empty() ? "" : ", ";
      stuck += who + " (pid " + std::to_string(pid) + ", " + state + ")";
    }
  }
  std::string out;
  if (!late.empty()) out = "ranks that did not arrive: " + late;
  if (!stuck.empty()) out += (out.empty() ? "" : "; ") + std::string("ranks that arrived but cannot progress: ") + stuck;
  if (out.empty()) out = "every rank on this node arrived";
  if (nnodes > 1) out += "; ranks on other nodes are not known";
  return out;
}

MpiComm::Impl::~Impl() {
  if (watchdog) watchdog->shutdown();  // its not_arrived() reads this object
  {
    std::lock_guard lk(mu);
    stop = true;
  }
  cv.notify_all();
  if (worker.joinable()) worker.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
  }
  for (MPI_Comm* c : {&cross, &node, &comm})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

CommWork MpiComm::Impl::submit(std::function<void()> fn, const char* what, std::uint64_t seq) {
  if (!threaded()) {
    detail::CommWait w(*watchdog, detail::CommWatchdog::kCaller, what, seq);
    fn();  // runs to completion here (no MPI_THREAD_MULTIPLE, or disabled)
    return std::make_unique<DoneHandle>();
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

// ---- shm collectives ----

// Small messages on one node: every rank copies its whole buffer in; one barrier; every rank
// reduces the whole message from all segments in rank order (the same kernel and order on
// every rank, so the same bits as the sliced form). One barrier instead of two, for n times
// the reduction reads: wins while latency dominates.
void MpiComm::Impl::shm_all_reduce_oneshot(TensorView buf, ReduceOp op) {
  const std::uint64_t seq = chunk_seq++;
  std::memcpy(half(node_rank, seq), buf.data, buf.bytes());
  sync_barrier();
  std::vector<const char*> srcs(node_size);
  for (int r = 0; r < node_size; ++r) srcs[r] = r == node_rank ? static_cast<const char*>(buf.data) : half(r, seq);
  reduce_slices(buf.data, srcs, buf.count, buf.dtype, op);
  if (op == ReduceOp::Avg) divide(buf.data, buf.count, buf.dtype, size);
}

void MpiComm::Impl::shm_all_reduce(TensorView buf, ReduceOp op) {
  // (Oversubscribed, the n-fold reads share the CPUs: measured slower from 16 KiB at 4 ranks on 2.)
  if (nnodes == 1 && !oversub && buf.bytes() <= std::min(opt.shm_oneshot_max, half_bytes))
    return shm_all_reduce_oneshot(buf, op);
  const std::size_t es = dtype_size(buf.dtype);
  const std::size_t chunk = half_bytes / es / 64 * 64;
  std::vector<const char*> srcs(node_size);
  const MPI_Op mop = nnodes > 1 ? mpi_reduce_op(op == ReduceOp::Avg ? ReduceOp::Sum : op, buf.dtype) : MPI_OP_NULL;
  const MPI_Datatype mtype = nnodes > 1 ? mpi_datatype(buf.dtype) : MPI_DATATYPE_NULL;
  for (std::size_t off = 0; off < buf.count; off += chunk) {
    const std::size_t len = std::min(chunk, buf.count - off);
    const std::uint64_t seq = chunk_seq++;
    // Slices aligned to 16 elements; identical on every rank (and node).
    const std::size_t per = (len + node_size - 1) / node_size;
    const std::size_t per_al = (per + 15) / 16 * 16;
    auto begin = [&](int j) { return std::min(len, static_cast<std::size_t>(j) * per_al); };
    char* mine = half(node_rank, seq);
    const std::size_t b = begin(node_rank), e = begin(node_rank + 1);
    // Peers need every slice of my chunk but mine; my own slice is read from `buf` directly.
    std::memcpy(mine, ptr(buf, off), b * es);
    std::memcpy(mine + e * es, ptr(buf, off + e), (len - e) * es);
    sync_barrier();
    for (int r = 0; r < node_size; ++r) srcs[r] = r == node_rank ? ptr(buf, off + b) : half(r, seq) + b * es;
    if (nnodes == 1 && op != ReduceOp::Avg) {
      // My slice's result goes to the window (for the peers) and to `buf` in one pass.
      reduce_slices(mine + b * es, srcs, e - b, buf.dtype, op, mptr(buf, off + b));
    } else {
      reduce_slices(mine + b * es, srcs, e - b, buf.dtype, op);
      if (nnodes > 1 && e > b)
        DS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mine + b * es, static_cast<int>(e - b), mtype, mop, cross));
      if (op == ReduceOp::Avg) divide(mine + b * es, e - b, buf.dtype, size);
      std::memcpy(mptr(buf, off + b), mine + b * es, (e - b) * es);
    }
    sync_barrier();
    for (int j = 0; j < node_size; ++j) {  // the peers' slices (mine is in `buf` already)
      const std::size_t jb = begin(j), je = begin(j + 1);
      if (j != node_rank && je > jb) std::memcpy(mptr(buf, off + jb), half(j, seq) + jb * es, (je - jb) * es);
    }
  }
}

void MpiComm::Impl::shm_reduce_scatter(TensorView send, TensorView recv, ReduceOp op) {
  const std::size_t es = dtype_size(send.dtype);
  const std::size_t n = recv.count;
  const std::size_t chunk = std::max<std::size_t>(half_bytes / es / node_size / 16 * 16, 16);
  std::vector<const char*> srcs(node_size);
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t len = std::min(chunk, n - off);
    const std::uint64_t seq = chunk_seq++;
    char* mine = half(node_rank, seq);
    for (int blk = 0; blk < node_size; ++blk)  // the peers' blocks; mine is read from `send`
      if (blk != node_rank) std::memcpy(mine + blk * len * es, ptr(send, blk * n + off), len * es);
    sync_barrier();
    for (int r = 0; r < node_size; ++r)
      srcs[r] = r == node_rank ? ptr(send, node_rank * n + off) : half(r, seq) + node_rank * len * es;
    reduce_slices(mptr(recv, off), srcs, len, send.dtype, op);
    if (op == ReduceOp::Avg) divide(mptr(recv, off), len, send.dtype, size);
  }
}

void MpiComm::Impl::shm_all_gather(TensorView send, TensorView recv) {
  const std::size_t es = dtype_size(send.dtype);
  const std::size_t n = send.count;
  const std::size_t chunk = half_bytes / es;
  const bool in_place = send.data == ptr(recv, node_rank * n);
  for (std::size_t off = 0; off < n; off += chunk) {
    const std::size_t len = std::min(chunk, n - off);
    const std::uint64_t seq = chunk_seq++;
    // My block into the window and (unless in place) into `recv`, reading `send` once.
    if (in_place) std::memcpy(half(node_rank, seq), ptr(send, off), len * es);
    else copy2(half(node_rank, seq), mptr(recv, node_rank * n + off), ptr(send, off), len * es);
    sync_barrier();
    for (int j = 0; j < node_size; ++j)
      if (j != node_rank) std::memcpy(mptr(recv, j * n + off), half(j, seq), len * es);
  }
}

// ---- plain MPI collectives (reqs != nullptr: non-blocking, requests appended) ----

void MpiComm::Impl::mpi_all_reduce(TensorView buf, ReduceOp op, std::vector<MPI_Request>* reqs) {
  const MPI_Datatype t = mpi_datatype(buf.dtype);
  const MPI_Op mop = mpi_reduce_op(op == ReduceOp::Avg ? ReduceOp::Sum : op, buf.dtype);
  for (std::size_t off = 0; off < buf.count; off += opt.max_count) {
    const int k = static_cast<int>(std::min(opt.max_count, buf.count - off));
    if (reqs) {
      reqs->emplace_back();
      DS_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, mptr(buf, off), k, t, mop, comm, &reqs->back()));
    } else {
      DS_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, mptr(buf, off), k, t, mop, comm));
    }
  }
  if (!reqs && op == ReduceOp::Avg) divide(buf.data, buf.count, buf.dtype, size);
}

void MpiComm::Impl::mpi_reduce_scatter(TensorView send, TensorView recv, ReduceOp op, std::vector<MPI_Request>* reqs) {
  const MPI_Datatype t = mpi_datatype(send.dtype);
  const MPI_Op mop = mpi_reduce_op(op == ReduceOp::Avg ? ReduceOp::Sum : op, send.dtype);
  const std::size_t n = recv.count;
  if (n * static_cast<std::size_t>(size) <= opt.max_count) {
    if (reqs) {
      reqs->emplace_back();
      DS_MPI_CHECK(MPI_Ireduce_scatter_block(send.data, recv.data, static_cast<int>(n), t, mop, comm, &reqs->back()));
    } else {
      DS_MPI_CHECK(MPI_Reduce_scatter_block(send.data, recv.data, static_cast<int>(n), t, mop, comm));
    }
  } else {
    // Too many elements for one int count: block r is reduced to rank r in pieces.
    for (int r = 0; r < size; ++r) {
      for (std::size_t off = 0; off < n; off += opt.max_count) {
        const int k = static_cast<int>(std::min(opt.max_count, n - off));
        void* out = r == rank ? mptr(recv, off) : nullptr;
        if (reqs) {
          reqs->emplace_back();
          DS_MPI_CHECK(MPI_Ireduce(ptr(send, r * n + off), out, k, t, mop, r, comm, &reqs->back()));
        } else {
          DS_MPI_CHECK(MPI_Reduce(ptr(send, r * n + off), out, k, t, mop, r, comm));
        }
      }
    }
  }
  if (!reqs && op == ReduceOp::Avg) divide(recv.data, recv.count, recv.dtype, size);
}

void MpiComm::Impl::mpi_all_gather(TensorView send, TensorView recv, std::vector<MPI_Request>* reqs) {
  const MPI_Datatype t = mpi_datatype(send.dtype);
  const std::size_t n = send.count;
  const bool in_place = send.data == ptr(recv, rank * n);
  if (n * static_cast<std::size_t>(size) <= opt.max_count) {
    const void* sbuf = in_place ? MPI_IN_PLACE : send.data;
    if (reqs) {
      reqs->emplace_back();
      DS_MPI_CHECK(MPI_Iallgather(sbuf, static_cast<int>(n), t, recv.data, static_cast<int>(n), t, comm, &reqs->back()));
    } else {
      DS_MPI_CHECK(MPI_Allgather(sbuf, static_cast<int>(n), t, recv.data, static_cast<int>(n), t, comm));
    }
  } else {
    // Too many elements for one int count: every rank broadcasts its block in pieces.
    if (!in_place) std::memcpy(mptr(recv, rank * n), send.data, send.bytes());
    for (int r = 0; r < size; ++r) {
      for (std::size_t off = 0; off < n; off += opt.max_count) {
        const int k = static_cast<int>(std::min(opt.max_count, n - off));
        if (reqs) {
          reqs->emplace_back();
          DS_MPI_CHECK(MPI_Ibcast(mptr(recv, r * n + off), k, t, r, comm, &reqs->back()));
        } else {
          DS_MPI_CHECK(MPI_Bcast(mptr(recv, r * n + off), k, t, r, comm));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// MpiComm
// ---------------------------------------------------------------------------------------
namespace {
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
bool MpiComm::shm_enabled() const { return impl_->win != MPI_WIN_NULL; }
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

void MpiComm::all_gather_mpi(TensorView send, TensorView recv) {
  check_ag(send, recv, size(), rank());
  if (send.count == 0) return;
  detail::CommWait w(*impl_->watchdog, detail::CommWatchdog::kCaller, "all_gather", impl_->arrive());
  impl_->mpi_all_gather(send, recv, nullptr);
}

}  // namespace ds
