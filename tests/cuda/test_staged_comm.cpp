// StagedComm (make_communicator(ctx, "staged")): every collective on device buffers against
// the plain MpiComm on host copies of the same inputs, byte for byte: all_reduce (sum, avg,
// max, min), reduce_scatter (also in place), reduce_scatter_in_place (uneven blocks), all_gather (also in place), broadcast from every
// root, blocking and non-blocking, the inputs uploaded asynchronously on the compute stream
// just before each call; non-blocking operations waited out of order (the newest first
// completes the older ones), polled with test(), and dropped unwaited; argument errors.
// Ranks share the GPUs (rank % devices), which NCCL refuses. Where no CUDA device is visible
// the factory must refuse with a ds::Error naming that, and the test exits 77 (skipped).
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/init.h"
#include "ds/mpi/mpi_comm.h"

namespace {
int g_fail = 0;
#define CHECK_OK(cond, ...)                              \
  do {                                                   \
    if (!(cond)) {                                       \
      ++g_fail;                                          \
      std::fprintf(stderr, "FAIL line %d: ", __LINE__);  \
      std::fprintf(stderr, __VA_ARGS__);                 \
      std::fprintf(stderr, "\n");                        \
    }                                                    \
  } while (0)
#define CUDA_OK(x)                                                                                         \
  do {                                                                                                     \
    cudaError_t e_ = (x);                                                                                  \
    if (e_ != cudaSuccess) {                                                                               \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));             \
      std::exit(1);                                                                                        \
    }                                                                                                      \
  } while (0)

using ds::DType;
using ds::ReduceOp;
using Bytes = std::vector<char>;

// Small integers: exact in every dtype, so any summation order gives the same bits.
float value(int r, std::size_t i) { return float(int((i * 7 + r * 3) % 17) - 8); }

Bytes input(DType t, int r, std::size_t n) {
  Bytes h(n * ds::dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const float v = value(r, i);
    switch (t) {
      case DType::F32: reinterpret_cast<float*>(h.data())[i] = v; break;
      case DType::F64: reinterpret_cast<double*>(h.data())[i] = v; break;
      case DType::F16: reinterpret_cast<ds::f16*>(h.data())[i] = ds::float_to_f16(v); break;
      case DType::BF16: reinterpret_cast<ds::bf16*>(h.data())[i] = ds::float_to_bf16(v); break;
      case DType::I32: reinterpret_cast<std::int32_t*>(h.data())[i] = std::int32_t(v); break;
      case DType::I64: reinterpret_cast<std::int64_t*>(h.data())[i] = std::int64_t(v); break;
      default: break;
    }
  }
  return h;
}

std::string name(DType t) { return std::string(ds::dtype_name(t)); }

// A device buffer with an asynchronous upload on the compute stream and a synchronous download.
struct Dev {
  void* p = nullptr;
  std::size_t bytes = 0;
  explicit Dev(std::size_t b) : bytes(b) { CUDA_OK(cudaMalloc(&p, b ? b : 1)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void upload(const Bytes& h, cudaStream_t s, std::size_t offset = 0) {
    if (!h.empty()) CUDA_OK(cudaMemcpyAsync(static_cast<char*>(p) + offset, h.data(), h.size(), cudaMemcpyHostToDevice, s));
  }
  Bytes download() const {
    Bytes h(bytes);
    if (bytes) CUDA_OK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
  char* at(std::size_t offset) const { return static_cast<char*>(p) + offset; }
};

struct Run {
  ds::Communicator& staged;
  ds::MpiComm& ref;
  cudaStream_t compute;
  int rank, size;

  // The host communicator's result, or its error (then the staged one must throw as well).
  template <class F>
  bool reference(F&& f, std::string& error) {
    try {
      f();
      return true;
    } catch (const ds::Error& e) {
      error = e.what();
      return false;
    }
  }

  void all_reduce(DType t, std::size_t n, ReduceOp op, bool blocking) {
    const std::string what = "all_reduce " + name(t) + " n=" + std::to_string(n) + " op=" +
                             std::string(ds::reduce_op_name(op)) + (blocking ? "" : " (non-blocking)");
    Bytes want = input(t, rank, n);
    std::string error;
    const bool ok = reference([&] { ref.all_reduce({want.data(), n, t}, op); }, error);
    Dev d(want.size());
    d.upload(input(t, rank, n), compute);
    try {
      if (blocking) staged.all_reduce({d.p, n, t}, op);
      else staged.iall_reduce({d.p, n, t}, op)->wait();
      CHECK_OK(ok, "%s: staged succeeded where MpiComm threw: %s", what.c_str(), error.c_str());
      if (ok) CHECK_OK(d.download() == want, "%s: result differs from MpiComm's", what.c_str());
    } catch (const ds::Error& e) {
      CHECK_OK(!ok, "%s: threw %s", what.c_str(), e.what());
    }
  }

  void reduce_scatter(DType t, std::size_t n, bool blocking, bool in_place) {
    const std::string what = "reduce_scatter " + name(t) + " n=" + std::to_string(n) +
                             (blocking ? "" : " (non-blocking)") + (in_place ? " in place" : "");
    const std::size_t es = ds::dtype_size(t);
    const Bytes in = input(t, rank, n * size);
    Bytes hsend = in, want(n * es);
    ref.reduce_scatter({hsend.data(), n * size, t}, {want.data(), n, t}, ReduceOp::Sum);
    Dev send(in.size()), other(n * es);
    send.upload(in, compute);
    void* recv = in_place ? send.at(rank * n * es) : other.p;
    if (blocking) staged.reduce_scatter({send.p, n * size, t}, {recv, n, t}, ReduceOp::Sum);
    else staged.ireduce_scatter({send.p, n * size, t}, {recv, n, t}, ReduceOp::Sum)->wait();
    Bytes got(n * es);
    if (!got.empty()) CUDA_OK(cudaMemcpy(got.data(), recv, got.size(), cudaMemcpyDeviceToHost));
    CHECK_OK(got == want, "%s: result differs from MpiComm's", what.c_str());
  }

  // ireduce_scatter_in_place with uneven blocks (rank b owns n + 3b elements): this rank's
  // block against MpiComm's; the bytes around it on the device must be the input's (only the
  // block is copied back).
  void reduce_scatter_in_place(DType t, std::size_t n, ReduceOp op) {
    const std::string what = "reduce_scatter_in_place " + name(t) + " n=" + std::to_string(n) + " op=" +
                             std::string(ds::reduce_op_name(op));
    const std::size_t es = ds::dtype_size(t);
    std::vector<std::size_t> counts(size);
    std::size_t total = 0, own = 0;
    for (int b = 0; b < size; ++b) {
      counts[b] = n + 3 * std::size_t(b);
      if (b < rank) own += counts[b];
      total += counts[b];
    }
    const Bytes in = input(t, rank, total);
    Bytes want = in;
    ref.ireduce_scatter_in_place({want.data(), total, t}, counts, op)->wait();
    Dev d(in.size());
    d.upload(in, compute);
    staged.ireduce_scatter_in_place({d.p, total, t}, counts, op)->wait();
    const Bytes got = d.download();
    const auto b0 = std::ptrdiff_t(own * es), b1 = std::ptrdiff_t((own + counts[rank]) * es);
    CHECK_OK(Bytes(got.begin() + b0, got.begin() + b1) == Bytes(want.begin() + b0, want.begin() + b1),
             "%s: this rank's block differs from MpiComm's", what.c_str());
    CHECK_OK(Bytes(got.begin(), got.begin() + b0) == Bytes(in.begin(), in.begin() + b0) &&
                 Bytes(got.begin() + b1, got.end()) == Bytes(in.begin() + b1, in.end()),
             "%s: bytes outside this rank's block changed on the device", what.c_str());
  }

  void all_gather(DType t, std::size_t n, bool blocking, bool in_place) {
    const std::string what = "all_gather " + name(t) + " n=" + std::to_string(n) +
                             (blocking ? "" : " (non-blocking)") + (in_place ? " in place" : "");
    const std::size_t es = ds::dtype_size(t);
    const Bytes mine = input(t, rank, n);
    Bytes want(n * es * size);
    Bytes hsend = mine;
    ref.all_gather({hsend.data(), n, t}, {want.data(), n * size, t});
    Dev recv(want.size()), send(mine.size());
    CUDA_OK(cudaMemsetAsync(recv.p, 0x5a, recv.bytes, compute));
    void* src = in_place ? recv.at(rank * n * es) : send.p;
    if (in_place) recv.upload(mine, compute, rank * n * es);
    else send.upload(mine, compute);
    if (blocking) staged.all_gather({src, n, t}, {recv.p, n * size, t});
    else staged.iall_gather({src, n, t}, {recv.p, n * size, t})->wait();
    CHECK_OK(recv.download() == want, "%s: result differs from MpiComm's", what.c_str());
  }

  void broadcast(DType t, std::size_t n, int root) {
    Bytes want = input(t, rank, n);
    ref.broadcast({want.data(), n, t}, root);
    Dev d(want.size());
    d.upload(input(t, rank, n), compute);
    staged.broadcast({d.p, n, t}, root);
    CHECK_OK(d.download() == want, "broadcast %s n=%zu root %d: result differs from MpiComm's", name(t).c_str(), n,
             root);
  }

  // Three operations in flight; waiting for the newest completes the other two first.
  void out_of_order_and_test(std::size_t n) {
    const DType t = DType::F32;
    const std::size_t es = 4;
    Bytes a = input(t, rank, n), rs_in = input(t, rank, n * size), rs_want(n * es), ag_want(n * es * size);
    Bytes hs = rs_in, hg = input(t, rank, n);
    ref.all_reduce({a.data(), n, t}, ReduceOp::Sum);
    ref.reduce_scatter({hs.data(), n * size, t}, {rs_want.data(), n, t}, ReduceOp::Sum);
    ref.all_gather({hg.data(), n, t}, {ag_want.data(), n * size, t});
    Dev da(n * es), ds_(n * es * size), dr(n * es), dg(n * es), dgr(n * es * size);
    da.upload(input(t, rank, n), compute);
    ds_.upload(rs_in, compute);
    dg.upload(input(t, rank, n), compute);
    auto w1 = staged.iall_reduce({da.p, n, t}, ReduceOp::Sum);
    auto w2 = staged.ireduce_scatter({ds_.p, n * size, t}, {dr.p, n, t}, ReduceOp::Sum);
    auto w3 = staged.iall_gather({dg.p, n, t}, {dgr.p, n * size, t});
    w3->wait();
    CHECK_OK(w1->test() && w2->test(), "waiting for the newest operation did not complete the older ones");
    CHECK_OK(da.download() == a, "all_reduce completed by a newer wait: result differs");
    CHECK_OK(dr.download() == rs_want, "reduce_scatter completed by a newer wait: result differs");
    CHECK_OK(dgr.download() == ag_want, "all_gather waited first: result differs");
    w1->wait();  // already complete: returns at once
    w2.reset();

    // test() polls to completion (bounded: then wait() anyway, and say so).
    Bytes b = input(t, rank, n);
    ref.all_reduce({b.data(), n, t}, ReduceOp::Max);
    da.upload(input(t, rank, n), compute);
    auto w = staged.iall_reduce({da.p, n, t}, ReduceOp::Max);
    bool done = false;
    for (int i = 0; i < 2000000 && !done; ++i) done = w->test();
    CHECK_OK(done, "test() never reported the operation complete");
    if (!done) w->wait();
    CHECK_OK(da.download() == b, "all_reduce polled with test(): result differs");

    // A handle dropped unwaited: the host collective still ends; the communicator stays usable.
    staged.iall_reduce({da.p, n, t}, ReduceOp::Sum).reset();
    staged.barrier();
  }

  void errors() {
    Dev d(64);
    try {
      staged.reduce_scatter({d.p, 3, DType::F32}, {d.p, 1, DType::F32}, ReduceOp::Sum);
      CHECK_OK(size == 3, "reduce_scatter with a bad count did not throw");
    } catch (const ds::Error& e) {
      CHECK_OK(std::strstr(e.what(), "StagedComm::reduce_scatter: send.count (3) must equal recv.count (1)") != nullptr,
               "error: %s", e.what());
    }
    try {
      staged.all_gather({d.p, 1, DType::F32}, {d.p, 2, DType::F16});
      CHECK_OK(false, "all_gather with mixed dtypes did not throw");
    } catch (const ds::Error& e) {
      CHECK_OK(std::strstr(e.what(), "StagedComm::all_gather: send dtype") != nullptr, "error: %s", e.what());
    }
    try {
      staged.broadcast({d.p, 1, DType::F32}, size);
      CHECK_OK(false, "broadcast from a root that is no rank did not throw");
    } catch (const ds::Error& e) {
      CHECK_OK(std::strstr(e.what(), "is not a rank") != nullptr, "error: %s", e.what());
    }
  }
};

}  // namespace

int main() {
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess) cudaGetLastError();
  try {
    ds::DistributedContext ctx = ds::init_distributed();
    if (rc != cudaSuccess || devices == 0) {
      // No device: the factory must say so, on every rank, without hanging.
      std::string error = "<no error>";
      try {
        ds::make_communicator(ctx, "staged");
      } catch (const ds::Error& e) {
        error = e.what();
      }
      const bool named = error.find("StagedComm: no CUDA device visible") != std::string::npos;
      if (!named) std::fprintf(stderr, "FAIL: make_communicator(ctx, \"staged\") without a device: %s\n", error.c_str());
      int bad = named ? 0 : 1, total = 0;
      MPI_Allreduce(&bad, &total, 1, MPI_INT, MPI_SUM, ctx.mpi_comm);
      if (ctx.rank == 0) std::printf("test_staged_comm: no CUDA device visible (the error names it): skipped\n");
      ds::finalize_distributed(ctx);
      return total == 0 ? 77 : 1;
    }
    ctx.device = ctx.local_rank % devices;  // ranks share the GPUs
    int total = 0;
    {
      auto comm = ds::make_communicator(ctx, "staged");
      CHECK_OK(comm->backend() == "staged", "backend %s", std::string(comm->backend()).c_str());
      ds::MpiComm ref(ctx.mpi_comm, ds::MpiCommOptions::from_env(), ctx.runtime);
      CUDA_OK(cudaSetDevice(ctx.device));
      cudaStream_t compute;
      CUDA_OK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
      comm->set_compute_stream(compute);
      Run run{*comm, ref, compute, ctx.rank, ctx.world_size};

      for (DType t : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64}) {
        for (std::size_t n : {std::size_t(0), std::size_t(1), std::size_t(7), std::size_t(278011)}) {
          for (bool blocking : {true, false}) {
            for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min})
              run.all_reduce(t, n, op, blocking);
            for (bool in_place : {false, true}) {
              run.reduce_scatter(t, n, blocking, in_place);
              run.all_gather(t, n, blocking, in_place);
            }
          }
          for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) run.reduce_scatter_in_place(t, n, op);
          for (int root = 0; root < ctx.world_size; ++root) run.broadcast(t, n, root);
        }
      }
      run.out_of_order_and_test(100003);
      run.errors();
      comm->barrier();

      MPI_Allreduce(&g_fail, &total, 1, MPI_INT, MPI_SUM, ctx.mpi_comm);
      if (ctx.rank == 0)
        std::printf("test_staged_comm: %d ranks on %d device(s), %d failures\n", ctx.world_size, devices, total);
      comm.reset();
      CUDA_OK(cudaStreamDestroy(compute));
    }
    ds::finalize_distributed(ctx);
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    ds::abort_job(1, std::string("test_staged_comm: error: ") + e.what());
  }
}
