// Multi-rank test of MpiComm (run under mpirun -np 2 and 4): every collective x dtype x op
// at sizes 1, 7 and 278011, on several communicator variants (shared-memory path forced,
// plain MPI, hierarchical with two "nodes", split counts, no progress thread). Inputs are
// small integers so every sum is exact; results are compared with no tolerance against the
// expected values and against plain MPI on the same data.
#include <mpi.h>
#include <sched.h>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/mpi/init.h"
#include "ds/mpi/mpi_comm.h"
#include "mpi_comm_testing.h"

namespace {

int g_failures = 0;
int g_rank = 0;

#define EXPECT(cond, ...)                                             \
  do {                                                                \
    if (!(cond)) {                                                    \
      ++g_failures;                                                   \
      if (g_failures < 20) {                                          \
        std::fprintf(stderr, "[rank %d] FAIL %s:%d: ", g_rank, __FILE__, __LINE__); \
        std::fprintf(stderr, __VA_ARGS__);                            \
        std::fprintf(stderr, "\n");                                   \
      }                                                               \
    }                                                                 \
  } while (0)

// Input element i of rank r: an integer in [-8, 8].
double value(int r, std::size_t i) { return double(int((i * 7 + r * 3 + (i >> 5)) % 17) - 8); }

void store(void* p, ds::DType t, std::size_t i, double v) {
  switch (t) {
    case ds::DType::F32: static_cast<float*>(p)[i] = float(v); break;
    case ds::DType::F64: static_cast<double*>(p)[i] = v; break;
    case ds::DType::I32: static_cast<std::int32_t*>(p)[i] = std::int32_t(v); break;
    case ds::DType::I64: static_cast<std::int64_t*>(p)[i] = std::int64_t(v); break;
    case ds::DType::F16: static_cast<ds::f16*>(p)[i] = ds::float_to_f16(float(v)); break;
    case ds::DType::BF16: static_cast<ds::bf16*>(p)[i] = ds::float_to_bf16(float(v)); break;
    default: break;
  }
}

// Expected result of op over ranks 0..n-1 of value(r, i) in dtype t, stored in t.
void expected(void* p, ds::DType t, std::size_t at, std::size_t i, int n, ds::ReduceOp op) {
  double s = 0, mx = -1e9, mn = 1e9;
  for (int r = 0; r < n; ++r) {
    double v = value(r, i);
    s += v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  double v = op == ds::ReduceOp::Max ? mx : op == ds::ReduceOp::Min ? mn : s;
  if (op == ds::ReduceOp::Avg) {
    if (t == ds::DType::I32 || t == ds::DType::I64) v = double(std::int64_t(s) / n);  // truncation, like C
    else v = s / n;  // n is 2 or 4: exact
  }
  store(p, t, at, v);
}

const ds::DType kTypes[] = {ds::DType::F32, ds::DType::F64, ds::DType::F16, ds::DType::BF16, ds::DType::I32, ds::DType::I64};
const std::size_t kSizes[] = {1, 7, 278011};

std::string tag(const char* variant, const char* coll, ds::DType t, ds::ReduceOp op, std::size_t n) {
  return std::string(variant) + " " + coll + " " + std::string(ds::dtype_name(t)) + " " +
         std::string(ds::reduce_op_name(op)) + " n=" + std::to_string(n);
}

std::size_t mismatches(const std::vector<char>& a, const std::vector<char>& b, std::size_t es) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < a.size(); i += es) bad += std::memcmp(&a[i], &b[i], es) != 0;
  return bad;
}

// types / ops: the subsets to run (the full matrix runs on the main variants only; the
// machine is small and shared, so the side variants cover their own code paths).
void run_variant(ds::MpiComm& c, const char* variant, bool nonblocking, bool compare_mpi,
                 std::vector<ds::DType> types = {}, std::vector<ds::ReduceOp> ops = {}) {
  const int r = c.rank(), n = c.size();
  const double t0 = MPI_Wtime();
  if (types.empty()) types.assign(std::begin(kTypes), std::end(kTypes));
  const bool all_ops = ops.empty();
  for (ds::DType t : types) {
    const std::size_t es = ds::dtype_size(t);
    // Every op on fp32; sum plus one other op on each other dtype (the machine is small and
    // shared: every synchronisation costs a time slice when ranks outnumber cores).
    if (all_ops) {
      switch (t) {
        case ds::DType::F32: ops = {ds::ReduceOp::Sum, ds::ReduceOp::Avg, ds::ReduceOp::Max, ds::ReduceOp::Min}; break;
        case ds::DType::F64: ops = {ds::ReduceOp::Sum, ds::ReduceOp::Min}; break;
        case ds::DType::F16: ops = {ds::ReduceOp::Sum, ds::ReduceOp::Avg}; break;
        case ds::DType::BF16: ops = {ds::ReduceOp::Sum, ds::ReduceOp::Max}; break;
        case ds::DType::I32: ops = {ds::ReduceOp::Sum, ds::ReduceOp::Avg}; break;
        default: ops = {ds::ReduceOp::Sum, ds::ReduceOp::Max}; break;
      }
    }
    for (std::size_t count : kSizes) {
      for (ds::ReduceOp op : ops) {
        // all_reduce
        std::vector<char> buf(count * es), ref(count * es), exp(count * es);
        for (std::size_t i = 0; i < count; ++i) store(buf.data(), t, i, value(r, i));
        ref = buf;
        for (std::size_t i = 0; i < count; ++i) expected(exp.data(), t, i, i, n, op);
        ds::TensorView v{buf.data(), count, t};
        if (nonblocking) c.iall_reduce(v, op)->wait(); else c.all_reduce(v, op);
        if (compare_mpi) ds::detail::MpiCommTesting::all_reduce_mpi(c, ds::TensorView{ref.data(), count, t}, op);
        else ref = exp;
        std::size_t bad = mismatches(buf, exp, es), bad_mpi = mismatches(buf, ref, es);
        EXPECT(bad == 0 && bad_mpi == 0, "%s: %zu wrong vs expected, %zu differ from plain MPI",
               tag(variant, "all_reduce", t, op, count).c_str(), bad, bad_mpi);

        // reduce_scatter: block b of rank r's send holds value(r, b*count + i)
        std::vector<char> send(count * n * es), recv(count * es), rref(count * es), rexp(count * es);
        for (std::size_t i = 0; i < count * n; ++i) store(send.data(), t, i, value(r, i));
        for (std::size_t i = 0; i < count; ++i) expected(rexp.data(), t, i, r * count + i, n, op);
        ds::TensorView sv{send.data(), count * n, t}, rv{recv.data(), count, t};
        if (nonblocking) c.ireduce_scatter(sv, rv, op)->wait(); else c.reduce_scatter(sv, rv, op);
        if (compare_mpi) ds::detail::MpiCommTesting::reduce_scatter_mpi(c, sv, ds::TensorView{rref.data(), count, t}, op);
        else rref = rexp;
        bad = mismatches(recv, rexp, es);
        bad_mpi = mismatches(recv, rref, es);
        EXPECT(bad == 0 && bad_mpi == 0, "%s: %zu wrong vs expected, %zu differ from plain MPI",
               tag(variant, "reduce_scatter", t, op, count).c_str(), bad, bad_mpi);

        // reduce_scatter_in_place: uneven blocks (rank b owns count + 5b elements; at count 7
        // rank 1 owns none), element i of rank r's buffer is value(r, i); only this rank's
        // block is compared.
        std::vector<std::size_t> counts(n);
        std::size_t total = 0, own = 0;
        for (int b = 0; b < n; ++b) {
          counts[b] = count == 7 && b == 1 ? 0 : count + 5 * std::size_t(b);
          if (b < r) own += counts[b];
          total += counts[b];
        }
        std::vector<char> ip(total * es), ipref(total * es), ipexp(counts[r] * es);
        for (std::size_t i = 0; i < total; ++i) store(ip.data(), t, i, value(r, i));
        ipref = ip;
        for (std::size_t i = 0; i < counts[r]; ++i) expected(ipexp.data(), t, i, own + i, n, op);
        c.ireduce_scatter_in_place(ds::TensorView{ip.data(), total, t}, counts, op)->wait();
        std::vector<char> got(ip.begin() + own * es, ip.begin() + (own + counts[r]) * es), got_mpi = ipexp;
        if (compare_mpi) {
          ds::detail::MpiCommTesting::reduce_scatter_in_place_mpi(c, ds::TensorView{ipref.data(), total, t}, counts, op);
          got_mpi.assign(ipref.begin() + own * es, ipref.begin() + (own + counts[r]) * es);
        }
        bad = mismatches(got, ipexp, es);
        bad_mpi = mismatches(got, got_mpi, es);
        EXPECT(bad == 0 && bad_mpi == 0, "%s: %zu wrong vs expected, %zu differ from plain MPI",
               tag(variant, "reduce_scatter_in_place", t, op, count).c_str(), bad, bad_mpi);
      }
      // all_gather (out of place and in place)
      std::vector<char> send(count * es), recv(count * n * es), gexp(count * n * es), inplace(count * n * es);
      for (std::size_t i = 0; i < count; ++i) store(send.data(), t, i, value(r, i));
      for (int b = 0; b < n; ++b)
        for (std::size_t i = 0; i < count; ++i) store(gexp.data(), t, b * count + i, value(b, i));
      ds::TensorView sv{send.data(), count, t}, rv{recv.data(), count * n, t};
      if (nonblocking) c.iall_gather(sv, rv)->wait(); else c.all_gather(sv, rv);
      std::size_t bad = mismatches(recv, gexp, es);
      EXPECT(bad == 0, "%s: %zu wrong", tag(variant, "all_gather", t, ds::ReduceOp::Sum, count).c_str(), bad);
      std::memcpy(inplace.data() + r * count * es, send.data(), count * es);
      c.all_gather(ds::TensorView{inplace.data() + r * count * es, count, t}, ds::TensorView{inplace.data(), count * n, t});
      bad = mismatches(inplace, gexp, es);
      EXPECT(bad == 0, "%s in place: %zu wrong", tag(variant, "all_gather", t, ds::ReduceOp::Sum, count).c_str(), bad);
    }
  }
  // broadcast from the last rank
  std::vector<std::int64_t> b(1000);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = r == n - 1 ? std::int64_t(i * 3) : -1;
  c.broadcast(ds::TensorView{b.data(), b.size(), ds::DType::I64}, n - 1);
  for (std::size_t i = 0; i < b.size(); ++i) EXPECT(b[i] == std::int64_t(i * 3), "%s broadcast [%zu]", variant, i);
  c.barrier();
  if (r == 0) std::printf("  %-22s %.2f s\n", variant, MPI_Wtime() - t0);
}

// Two (and three) outstanding non-blocking operations of different kinds, waited in order;
// the caller computes in between (the overlap the engine relies on).
void run_overlap(ds::MpiComm& c, const char* variant, int rounds) {
  const int r = c.rank(), n = c.size();
  const std::size_t count = 278011;
  std::vector<float> a(count), b(count), send(count * n), recv(count);
  for (std::size_t i = 0; i < count; ++i) { a[i] = float(value(r, i)); b[i] = float(value(r, i + 1)); }
  for (std::size_t i = 0; i < count * n; ++i) send[i] = float(value(r, i));
  for (int round = 0; round < rounds; ++round) {
    std::vector<float> a0 = a, b0 = b;
    auto h1 = c.iall_reduce(ds::TensorView{a0.data(), count, ds::DType::F32}, ds::ReduceOp::Sum);
    auto h2 = c.iall_reduce(ds::TensorView{b0.data(), count, ds::DType::F32}, ds::ReduceOp::Max);
    auto h3 = c.ireduce_scatter(ds::TensorView{send.data(), count * n, ds::DType::F32},
                                ds::TensorView{recv.data(), count, ds::DType::F32}, ds::ReduceOp::Sum);
    double busy = 0;
    for (std::size_t i = 0; i < count; ++i) busy += send[i] * 0.5;  // compute while they run
    h1->wait();
    h2->wait();
    h3->wait();
    EXPECT(h1->test() && h2->test() && h3->test(), "%s: test() false after wait()", variant);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double s = 0, m = -1e9, rs = 0;
      for (int q = 0; q < n; ++q) { s += value(q, i); m = std::max(m, value(q, i + 1)); rs += value(q, r * count + i); }
      bad += a0[i] != float(s) || b0[i] != float(m) || recv[i] != float(rs);
    }
    EXPECT(bad == 0, "%s overlap round %d: %zu wrong (busy %g)", variant, round, bad, busy);
  }
  // A blocking call while a non-blocking one is outstanding is ordered after it.
  std::vector<float> x(count, 1.0f), y(count, 2.0f);
  auto h = c.iall_reduce(ds::TensorView{x.data(), count, ds::DType::F32}, ds::ReduceOp::Sum);
  c.all_reduce(ds::TensorView{y.data(), count, ds::DType::F32}, ds::ReduceOp::Sum);
  h->wait();
  EXPECT(x[count - 1] == float(n) && y[0] == float(2 * n), "%s: blocking after non-blocking", variant);
}

// Bad arguments throw ds::Error on every rank (no collective is started).
void run_errors(ds::MpiComm& c) {
  std::vector<float> v(10);
  auto throws = [](const std::function<void()>& f, const char* needle) {
    try {
      f();
    } catch (const ds::Error& e) {
      return std::strstr(e.what(), needle) != nullptr;
    }
    return false;
  };
  const int n = c.size();
  EXPECT(throws([&] { c.reduce_scatter({v.data(), 10, ds::DType::F32}, {v.data(), 3, ds::DType::F32}, ds::ReduceOp::Sum); }, "send.count"),
         "reduce_scatter bad counts");
  {
    std::vector<std::size_t> short_counts(std::size_t(c.size()), 1), wrong_sum(std::size_t(c.size()), 1);
    short_counts.pop_back();
    EXPECT(throws([&] { c.ireduce_scatter_in_place({v.data(), short_counts.size(), ds::DType::F32}, short_counts, ds::ReduceOp::Sum); },
                  "block counts for"),
           "reduce_scatter_in_place: a count per rank");
    EXPECT(throws([&] { c.ireduce_scatter_in_place({v.data(), 10, ds::DType::F32}, wrong_sum, ds::ReduceOp::Sum); }, "sum to"),
           "reduce_scatter_in_place: counts sum to buf.count");
  }
  std::vector<float> big(10 * n + 5);
  EXPECT(throws([&] { c.all_gather({v.data(), 10, ds::DType::F32}, {big.data(), std::size_t(10 * n + 5), ds::DType::F32}); }, "recv.count"),
         "all_gather bad counts");
  EXPECT(throws([&] { c.all_reduce({v.data(), 10, ds::DType::U8}, ds::ReduceOp::Sum); }, "uint8"), "u8 all_reduce");
  EXPECT(throws([&] { c.all_reduce({v.data(), 10, ds::DType::U8}, ds::ReduceOp::Max); }, "max"), "u8 names the op");
  EXPECT(throws([&] { c.all_reduce({v.data(), 2, ds::DType::F32}, static_cast<ds::ReduceOp>(9)); }, "fp32"), "bad op");
  EXPECT(throws([&] { c.broadcast({v.data(), 10, ds::DType::F32}, n); }, "root"), "bad root");
  EXPECT(throws([&] { c.all_reduce({nullptr, 10, ds::DType::F32}, ds::ReduceOp::Sum); }, "no data"), "null data");
  std::vector<float> w(10 * n, 0.f);
  EXPECT(throws([&] { c.reduce_scatter({w.data(), 10ul * n, ds::DType::F32}, {w.data(), 10, ds::DType::F32}, ds::ReduceOp::Sum); }, "overlap"),
         "overlap");
  EXPECT(throws([&] { c.all_gather({v.data(), 10, ds::DType::F32}, {w.data(), 10ul * n, ds::DType::F16}); }, "dtype"),
         "dtype mismatch");
}

// Which path a message takes: shm_min, the plain-MPI bands (and when they apply), their
// environment overrides and errors. Same answers on every rank.
void run_dispatch(const ds::DistributedContext& ctx) {
  ds::MpiCommOptions o;
  o.plain_all_reduce = {1024, 4096};
  o.plain_reduce_scatter = {0, 0};
  o.plain_all_gather = {512, 8192};
  o.plain_all_gather_in_place = {256, 1024};
  o.plain_all_gather_oversubscribed = {2048, 4096};
  o.plain_all_reduce_oversubscribed = {8192, 16384};
  o.shm_min_reduce_scatter = 64;
  o.oversubscribed = 0;  // bands apply whatever the CPU count
  {
    ds::MpiComm c(ctx.mpi_comm, o);
    const bool w = ctx.world_size > 1;
    EXPECT(c.shm_all_reduce_for(1023) == w && !c.shm_all_reduce_for(1024) && !c.shm_all_reduce_for(4095) &&
               c.shm_all_reduce_for(4096) == w,
           "all_reduce band [1K, 4K)");
    EXPECT(!c.shm_reduce_scatter_for(63) && c.shm_reduce_scatter_for(64) == w && c.shm_reduce_scatter_for(1 << 30) == w,
           "reduce_scatter shm_min 64, no band");
    EXPECT(c.shm_all_gather_for(511) == w && !c.shm_all_gather_for(512) && c.shm_all_gather_for(8192) == w,
           "all_gather band [512, 8K)");
    EXPECT(c.shm_all_gather_for(255, false, true) == w && !c.shm_all_gather_for(256, false, true) &&
               c.shm_all_gather_for(1024, false, true) == w,
           "in-place all_gather band [256, 1K)");
    // Non-blocking calls the progress thread runs keep the window inside a band.
    EXPECT(c.shm_all_reduce_for(2048, true) == (w && c.uses_progress_thread()) && !c.shm_reduce_scatter_for(63, true),
           "non-blocking: band skipped with the progress thread, shm_min kept");
  }
  {
    // Detected: the ranks share one node and are unbound (ds_mpi_test: --bind-to none), so
    // oversubscribed exactly when there are more of them than this rank's CPUs.
    ds::MpiCommOptions p = o;
    p.oversubscribed = -1;
    ds::MpiComm c(ctx.mpi_comm, p);
    cpu_set_t set;
    CPU_ZERO(&set);
    sched_getaffinity(0, sizeof set, &set);
    EXPECT(c.oversubscribed() == (ctx.world_size > CPU_COUNT(&set)), "oversubscribed %d with %d ranks on %d cpus",
           int(c.oversubscribed()), ctx.world_size, CPU_COUNT(&set));
  }
  {
    ds::MpiCommOptions p = o;
    p.progress_thread = false;
    ds::MpiComm c(ctx.mpi_comm, p);
    EXPECT(!c.shm_all_reduce_for(2048, true), "non-blocking without the progress thread: band applies");
  }
  {
    // The config's `communication` keys turn the paths off after construction (set_paths).
    ds::MpiComm c(ctx.mpi_comm, o);
    const bool threaded = c.uses_progress_thread();
    c.set_paths({/*shared_memory=*/true, /*progress_thread=*/false});
    EXPECT(!c.uses_progress_thread() && c.shm_enabled() == (ctx.world_size > 1) &&
               c.shm_all_reduce_for(4096) == (ctx.world_size > 1),
           "set_paths: progress thread off, window kept (was threaded %d)", int(threaded));
    c.set_paths({/*shared_memory=*/false, /*progress_thread=*/true});
    EXPECT(!c.shm_enabled() && !c.shm_all_reduce_for(4096) && !c.shm_all_gather_for(1 << 20) &&
               !c.shm_reduce_scatter_for(1 << 20) && !c.uses_progress_thread(),
           "set_paths: window off, and what was off stays off");
    std::vector<float> v(3000, float(ctx.rank + 1));
    c.all_reduce(ds::TensorView{v.data(), v.size(), ds::DType::F32}, ds::ReduceOp::Sum);
    const float want = float(ctx.world_size * (ctx.world_size + 1) / 2);
    EXPECT(v[0] == want && v[2999] == want, "all_reduce after set_paths: %g, want %g", double(v[0]), double(want));
  }
  {
    ds::MpiCommOptions p = o;
    p.oversubscribed = 1;
    ds::MpiComm c(ctx.mpi_comm, p);
    EXPECT(c.oversubscribed() && c.shm_all_reduce_for(2048) == (ctx.world_size > 1), "bands unused when oversubscribed");
    EXPECT(!c.shm_all_reduce_for(8192) && c.shm_all_reduce_for(16384) == (ctx.world_size > 1),
           "oversubscribed: the all_reduce band for it, [8K, 16K)");
    EXPECT(c.shm_all_gather_for(1024) == (ctx.world_size > 1) && !c.shm_all_gather_for(2048) &&
               c.shm_all_gather_for(4096) == (ctx.world_size > 1) && c.shm_all_gather_for(512, false, true) == (ctx.world_size > 1),
           "oversubscribed: only the all_gather band for it, [2K, 4K)");
    p.set_shm_min(0);  // every size through the window
    ds::MpiComm f(ctx.mpi_comm, p);
    EXPECT(f.shm_all_reduce_for(2048) == (ctx.world_size > 1) && f.shm_all_gather_for(1024) == (ctx.world_size > 1) &&
               f.shm_reduce_scatter_for(1) == (ctx.world_size > 1),
           "set_shm_min(0) clears the bands");
  }
  // Environment: the debug overrides are registry rows (strict values, errors naming them);
  // the sizes and bands are constants, so a former DS_COMM_PLAIN_* / DS_COMM_SHM_MIN changes nothing.
  setenv("DS_COMM_PLAIN_ALL_REDUCE", "64K:2M", 1);
  setenv("DS_COMM_SHM_MIN", "16", 1);
  setenv("DS_COMM_OVERSUBSCRIBED", "1", 1);
  setenv("DS_COMM_RANKS_PER_NODE", "2", 1);
  setenv("DS_COMM_PROGRESS_THREAD", "0", 1);
  const ds::MpiCommOptions e = ds::MpiCommOptions::from_env();
  const ds::MpiCommOptions d;
  EXPECT(e.plain_all_reduce.from == d.plain_all_reduce.from && e.plain_all_reduce.below == d.plain_all_reduce.below &&
             e.shm_min_all_reduce == d.shm_min_all_reduce,
         "DS_COMM_PLAIN_ALL_REDUCE / DS_COMM_SHM_MIN are no longer read");
  EXPECT(e.oversubscribed == 1, "DS_COMM_OVERSUBSCRIBED=1");
  EXPECT(e.ranks_per_node == 2, "DS_COMM_RANKS_PER_NODE=2");
  EXPECT(!e.progress_thread && e.shm, "DS_COMM_PROGRESS_THREAD=0");
  unsetenv("DS_COMM_PROGRESS_THREAD");
  for (const char* bad : {"2", "x"}) {
    setenv("DS_COMM_OVERSUBSCRIBED", bad, 1);
    bool named = false;
    try {
      ds::MpiCommOptions::from_env();
    } catch (const ds::Error& err) {
      named = std::strstr(err.what(), "DS_COMM_OVERSUBSCRIBED") != nullptr;
    }
    EXPECT(named, "DS_COMM_OVERSUBSCRIBED='%s' must be an error naming the variable", bad);
  }
  unsetenv("DS_COMM_PLAIN_ALL_REDUCE");
  unsetenv("DS_COMM_SHM_MIN");
  unsetenv("DS_COMM_OVERSUBSCRIBED");
  unsetenv("DS_COMM_RANKS_PER_NODE");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ds::DistributedContext ctx = ds::init_distributed();
    g_rank = ctx.rank;
    auto& world = dynamic_cast<ds::MpiComm&>(*ctx.comm);
    EXPECT(world.rank() == ctx.rank && world.size() == ctx.world_size, "ctx.comm rank/size");
    EXPECT(ctx.local_size == ctx.world_size && ctx.local_rank == ctx.rank && ctx.node_rank == 0 && ctx.num_nodes == 1,
           "one node expected: local %d/%d node %d/%d", ctx.local_rank, ctx.local_size, ctx.node_rank, ctx.num_nodes);
    EXPECT(ctx.thread_level == MPI_THREAD_MULTIPLE, "thread level %d", ctx.thread_level);
    EXPECT(ctx.env.source == ds::LaunchSource::OpenMPI, "source %s", std::string(ds::launch_source_name(ctx.env.source)).c_str());

    // The communicator init_distributed() made (default options: which sizes take the window
    // depends on the plain-MPI bands and the CPU count; 278011 elements in one or two chunks).
    if (ctx.world_size == 2) run_variant(world, "default", false, false, {ds::DType::F32, ds::DType::I64});
    run_errors(world);
    run_dispatch(ctx);

    ds::MpiCommOptions o;
    o.set_shm_min(0);
    o.shm_chunk_bytes = 1 << 20;  // several chunks at 278011 elements: the double-buffer reuse runs
    {
      ds::MpiComm c(ctx.mpi_comm, o);
      EXPECT(c.shm_enabled() == (ctx.world_size > 1), "shm window expected");
      run_variant(c, "shm", false, true);
      run_variant(c, "shm-nonblocking", true, false, {ds::DType::F32, ds::DType::BF16}, {ds::ReduceOp::Sum});
      run_overlap(c, "shm", 1);
    }
    // Both CPU-count regimes whatever this machine has: one-shot small all_reduce and long
    // barrier spins (not oversubscribed), sliced small all_reduce and short spins (oversubscribed).
    for (int over : {0, 1}) {
      ds::MpiCommOptions p = o;
      p.oversubscribed = over;
      ds::MpiComm c(ctx.mpi_comm, p);
      run_variant(c, over ? "shm-oversubscribed" : "shm-not-oversubscribed", false, true,
                  {ds::DType::F32, ds::DType::F16, ds::DType::I32}, {ds::ReduceOp::Sum, ds::ReduceOp::Avg, ds::ReduceOp::Max});
    }
    {
      ds::MpiCommOptions p = o;
      p.progress_thread = false;
      ds::MpiComm c(ctx.mpi_comm, p);
      run_overlap(c, "shm-inline", 1);
    }
    if (ctx.world_size >= 4) {
      ds::MpiCommOptions h = o;
      h.ranks_per_node = 2;  // two "nodes" of two ranks: hierarchical all-reduce
      ds::MpiComm c(ctx.mpi_comm, h);
      EXPECT(c.num_nodes() == ctx.world_size / 2 && c.node_size() == 2, "hierarchical layout");
      run_variant(c, "hierarchical", false, true, {ds::DType::F32, ds::DType::BF16},
                  {ds::ReduceOp::Sum, ds::ReduceOp::Avg});
      run_overlap(c, "hierarchical", 1);
    }
    {
      ds::MpiCommOptions p;
      p.shm = false;
      p.max_count = 100000;  // splits 278011-element messages into int-sized pieces
      ds::MpiComm c(ctx.mpi_comm, p);
      EXPECT(!c.shm_enabled(), "shm off");
      run_variant(c, "mpi-split", false, false, {ds::DType::F32}, {ds::ReduceOp::Sum});
      run_variant(c, "mpi-split-nonblocking", true, false, {ds::DType::I64}, {ds::ReduceOp::Avg});
      run_overlap(c, "mpi", 1);
    }
    int total = 0;
    MPI_Allreduce(&g_failures, &total, 1, MPI_INT, MPI_SUM, ctx.mpi_comm);
    if (ctx.rank == 0) std::printf("test_collectives: %d ranks, %d failures\n", ctx.world_size, total);
    ds::finalize_distributed(ctx);
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    ds::abort_job(1, std::string("test_collectives: error: ") + e.what());
  }
  (void)argc;
  (void)argv;
}
