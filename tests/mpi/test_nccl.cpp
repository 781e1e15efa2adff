// NcclComm on real GPUs (one device per rank): every collective (all_gather also in place) and
// dtype at sizes 1, 7 and 278011 with exact inputs, non-blocking forms ordered after a compute
// stream, the factory's "auto" choice, and errors by name. Exits 77 (skipped) where no CUDA
// device is visible, or fewer devices than ranks on a node.
#include <cuda_runtime.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/init.h"
#include "ds/mpi/nccl_comm.h"

namespace {
int g_fail = 0;
#define CHECK_OK(cond, ...)                         \
  do {                                              \
    if (!(cond)) {                                  \
      ++g_fail;                                     \
      std::fprintf(stderr, "FAIL line %d: ", __LINE__); \
      std::fprintf(stderr, __VA_ARGS__);            \
      std::fprintf(stderr, "\n");                   \
    }                                               \
  } while (0)
#define CUDA_OK(x)                                                                        \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) { std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(1); } \
  } while (0)

float value(int r, std::size_t i) { return float(int((i * 7 + r * 3) % 17) - 8); }

void fill(std::vector<char>& h, ds::DType t, int r, std::size_t n, std::size_t first = 0) {
  h.resize(n * ds::dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const float v = value(r, first + i);
    switch (t) {
      case ds::DType::F32: reinterpret_cast<float*>(h.data())[i] = v; break;
      case ds::DType::F64: reinterpret_cast<double*>(h.data())[i] = v; break;
      case ds::DType::F16: reinterpret_cast<ds::f16*>(h.data())[i] = ds::float_to_f16(v); break;
      case ds::DType::BF16: reinterpret_cast<ds::bf16*>(h.data())[i] = ds::float_to_bf16(v); break;
      case ds::DType::I32: reinterpret_cast<std::int32_t*>(h.data())[i] = std::int32_t(v); break;
      case ds::DType::I64: reinterpret_cast<std::int64_t*>(h.data())[i] = std::int64_t(v); break;
      default: break;
    }
  }
}

std::vector<char> sum_of(ds::DType t, int n_ranks, std::size_t n, std::size_t first = 0) {
  std::vector<char> out, one;
  std::vector<double> acc(n, 0.0);
  for (int r = 0; r < n_ranks; ++r)
    for (std::size_t i = 0; i < n; ++i) acc[i] += value(r, first + i);
  out.resize(n * ds::dtype_size(t));
  for (std::size_t i = 0; i < n; ++i) {
    const double v = acc[i];
    switch (t) {
      case ds::DType::F32: reinterpret_cast<float*>(out.data())[i] = float(v); break;
      case ds::DType::F64: reinterpret_cast<double*>(out.data())[i] = v; break;
      case ds::DType::F16: reinterpret_cast<ds::f16*>(out.data())[i] = ds::float_to_f16(float(v)); break;
      case ds::DType::BF16: reinterpret_cast<ds::bf16*>(out.data())[i] = ds::float_to_bf16(float(v)); break;
      case ds::DType::I32: reinterpret_cast<std::int32_t*>(out.data())[i] = std::int32_t(v); break;
      case ds::DType::I64: reinterpret_cast<std::int64_t*>(out.data())[i] = std::int64_t(v); break;
      default: break;
    }
  }
  return out;
}
}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("test_nccl: no CUDA device visible: skipped\n");
    return 77;
  }
  try {
    ds::DistributedContext ctx = ds::init_distributed();
    int enough = devices >= ctx.local_size ? 1 : 0, all = 0;
    MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, ctx.mpi_comm);
    if (!all) {
      if (ctx.rank == 0) std::printf("test_nccl: %d devices for %d local ranks: skipped\n", devices, ctx.local_size);
      ds::finalize_distributed(ctx);
      return 77;
    }
    auto comm = ds::make_communicator(ctx, "nccl");
    CHECK_OK(comm->backend() == "nccl", "backend");
    CHECK_OK(ds::make_communicator(ctx, "auto")->backend() == "nccl", "auto picks nccl with GPUs");
    auto& nc = dynamic_cast<ds::NcclComm&>(*comm);
    cudaStream_t compute;
    CUDA_OK(cudaStreamCreate(&compute));
    nc.set_compute_stream(compute);
    const int n = ctx.world_size, r = ctx.rank;
    for (ds::DType t : {ds::DType::F32, ds::DType::F64, ds::DType::F16, ds::DType::BF16, ds::DType::I32, ds::DType::I64}) {
      for (std::size_t count : {std::size_t(1), std::size_t(7), std::size_t(278011)}) {
        const std::size_t es = ds::dtype_size(t);
        std::vector<char> h, back(count * es), exp = sum_of(t, n, count);
        fill(h, t, r, count);
        void *d = nullptr, *d2 = nullptr;
        CUDA_OK(cudaMalloc(&d, count * es * n));
        CUDA_OK(cudaMalloc(&d2, count * es * n));
        // blocking all_reduce
        CUDA_OK(cudaMemcpy(d, h.data(), count * es, cudaMemcpyHostToDevice));
        comm->all_reduce({d, count, t}, ds::ReduceOp::Sum);
        CUDA_OK(cudaMemcpy(back.data(), d, count * es, cudaMemcpyDeviceToHost));
        CHECK_OK(back == exp, "all_reduce %s n=%zu", std::string(ds::dtype_name(t)).c_str(), count);
        // non-blocking all_reduce after an async upload on the compute stream
        CUDA_OK(cudaMemcpyAsync(d, h.data(), count * es, cudaMemcpyHostToDevice, compute));
        auto w = comm->iall_reduce({d, count, t}, ds::ReduceOp::Sum);
        w->wait();
        CUDA_OK(cudaMemcpy(back.data(), d, count * es, cudaMemcpyDeviceToHost));
        CHECK_OK(back == exp, "iall_reduce %s n=%zu", std::string(ds::dtype_name(t)).c_str(), count);
        // reduce_scatter: send block b holds value(r, b*count + i)
        std::vector<char> hs;
        fill(hs, t, r, count * n);
        CUDA_OK(cudaMemcpy(d, hs.data(), count * es * n, cudaMemcpyHostToDevice));
        comm->reduce_scatter({d, count * n, t}, {d2, count, t}, ds::ReduceOp::Sum);
        CUDA_OK(cudaMemcpy(back.data(), d2, count * es, cudaMemcpyDeviceToHost));
        CHECK_OK(back == sum_of(t, n, count, r * count), "reduce_scatter %s n=%zu", std::string(ds::dtype_name(t)).c_str(), count);
        // reduce_scatter_in_place: the same input as one buffer of n blocks of `count`, except
        // that rank 0's block is empty and the last rank's holds two blocks' worth
        {
          std::vector<std::size_t> counts(n, count);
          if (n > 1) {
            counts[0] = 0;
            counts[n - 1] = 2 * count;
          }
          std::size_t own = 0;
          for (int b = 0; b < r; ++b) own += counts[b];
          CUDA_OK(cudaMemcpy(d, hs.data(), count * es * n, cudaMemcpyHostToDevice));
          comm->ireduce_scatter_in_place({d, count * n, t}, counts, ds::ReduceOp::Sum)->wait();
          std::vector<char> mine(counts[r] * es);
          if (!mine.empty())
            CUDA_OK(cudaMemcpy(mine.data(), static_cast<char*>(d) + own * es, mine.size(), cudaMemcpyDeviceToHost));
          CHECK_OK(mine == sum_of(t, n, counts[r], own), "reduce_scatter_in_place %s n=%zu",
                   std::string(ds::dtype_name(t)).c_str(), count);
        }
        // all_gather
        CUDA_OK(cudaMemcpy(d, h.data(), count * es, cudaMemcpyHostToDevice));
        comm->all_gather({d, count, t}, {d2, count * n, t});
        std::vector<char> g(count * es * n);
        CUDA_OK(cudaMemcpy(g.data(), d2, count * es * n, cudaMemcpyDeviceToHost));
        for (int b = 0; b < n; ++b) {
          std::vector<char> blk;
          fill(blk, t, b, count);
          CHECK_OK(std::memcmp(g.data() + b * count * es, blk.data(), count * es) == 0, "all_gather block %d", b);
        }
        // all_gather in place (the engine's ZeRO-1 gather): send is this rank's block of recv
        CUDA_OK(cudaMemset(d2, 0, count * es * n));
        CUDA_OK(cudaMemcpy(static_cast<char*>(d2) + r * count * es, h.data(), count * es, cudaMemcpyHostToDevice));
        comm->all_gather({static_cast<char*>(d2) + r * count * es, count, t}, {d2, count * n, t});
        CUDA_OK(cudaMemcpy(g.data(), d2, count * es * n, cudaMemcpyDeviceToHost));
        for (int b = 0; b < n; ++b) {
          std::vector<char> blk;
          fill(blk, t, b, count);
          CHECK_OK(std::memcmp(g.data() + b * count * es, blk.data(), count * es) == 0, "in-place all_gather block %d", b);
        }
        CUDA_OK(cudaFree(d));
        CUDA_OK(cudaFree(d2));
      }
    }
    comm->barrier();
    try {
      comm->all_reduce({nullptr, 4, ds::DType::U8}, ds::ReduceOp::Sum);
      CHECK_OK(false, "u8 all_reduce must throw");
    } catch (const ds::Error& e) {
      CHECK_OK(std::strstr(e.what(), "uint8") != nullptr, "error names the dtype: %s", e.what());
    }
    int total = 0;
    MPI_Allreduce(&g_fail, &total, 1, MPI_INT, MPI_SUM, ctx.mpi_comm);
    if (r == 0) std::printf("test_nccl: %d ranks, %d failures\n", n, total);
    comm.reset();
    cudaStreamDestroy(compute);
    ds::finalize_distributed(ctx);
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    ds::abort_job(1, std::string("test_nccl: error: ") + e.what());
  }
}
