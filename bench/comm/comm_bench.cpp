// comm_bench: time, algbw, busbw and #wrong for MpiComm's all_reduce / reduce_scatter /
// all_gather (fp32) per message size, each beside the raw MPI call timed in the same run
// (MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather on the same buffers) and the
// machine's memcpy bandwidth at that size. nccl-tests definitions: size = bytes of the full
// buffer (all_reduce: the buffer; reduce_scatter: the send buffer; all_gather: the receive
// buffer), algbw = size / time, busbw = algbw * 2(n-1)/n (all_reduce) or (n-1)/n (others).
// Each time is the slowest rank's, the median of the repeats after warm-up.
//
//   mpirun -np 4 --oversubscribe --bind-to none build/bench/comm/comm_bench [--max_size 256M]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/mpi/init.h"
#include "ds/mpi/mpi_comm.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Median over repeats of the slowest rank's time; `prepare` runs untimed before each repeat.
// *best gets the fastest repeat (on a loaded machine the median catches preemptions).
double timed(MPI_Comm comm, int warmup, int reps, const std::function<void()>& prepare, const std::function<void()>& op,
             double* best = nullptr) {
  std::vector<double> t;
  for (int i = 0; i < warmup + reps; ++i) {
    if (prepare) prepare();
    MPI_Barrier(comm);
    const double t0 = now();
    op();
    double dt = now() - t0, mx = 0;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, comm);
    if (i >= warmup) t.push_back(mx);
  }
  std::sort(t.begin(), t.end());
  if (best) *best = t.front();
  return t[t.size() / 2];
}

float value(int r, std::size_t i) { return float(int((i * 7 + r * 3) % 17) - 8); }

std::string human(std::size_t b) {
  char s[32];
  if (b >= (1u << 20)) std::snprintf(s, sizeof s, "%zuM", b >> 20);
  else std::snprintf(s, sizeof s, "%zuK", b >> 10);
  return s;
}

std::size_t parse_size(const std::string& s) {
  std::size_t v = std::stoull(s);
  if (s.back() == 'K' || s.back() == 'k') v <<= 10;
  if (s.back() == 'M' || s.back() == 'm') v <<= 20;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"communication benchmark: MpiComm vs raw MPI vs memcpy"};
  std::string min_s = "4K", max_s = "256M";
  int warmup = 2;
  double budget = 0.4;  // seconds of timed work per size and collective (repeats 3..50)
  std::string only;
  app.add_option("--min_size", min_s, "smallest message (bytes; K/M suffix)");
  app.add_option("--max_size", max_s, "largest message (bytes; K/M suffix)");
  app.add_option("--warmup", warmup, "untimed repeats per size");
  app.add_option("--budget", budget, "seconds of repeats per size and collective");
  app.add_option("--only", only, "all_reduce | reduce_scatter | all_gather");
  CLI11_PARSE(app, argc, argv);

  ds::DistributedContext ctx = ds::init_distributed();
  auto& comm = dynamic_cast<ds::MpiComm&>(*ctx.comm);
  const int n = ctx.world_size, r = ctx.rank;
  const std::size_t min_b = parse_size(min_s), max_b = parse_size(max_s);
  const std::size_t max_elems = max_b / 4;

  // Allocated and touched once (fresh pages cost ~13 us each here).
  ds::HostBuffer work(max_elems, ds::DType::F32), pristine(max_elems, ds::DType::F32), scratch(max_elems, ds::DType::F32);
  float* W = work.as<float>();
  float* P = pristine.as<float>();
  float* S = scratch.as<float>();
  for (std::size_t i = 0; i < max_elems; ++i) P[i] = value(r, i);
  std::memcpy(W, P, max_elems * 4);
  std::memcpy(S, P, max_elems * 4);

  if (r == 0) {
    const char* tun = std::getenv("GLIBC_TUNABLES");
    const auto& o = comm.options();
    std::printf("# comm_bench: %d ranks, %d node(s), shm %s (chunk %zu KiB; from %zu / %zu / %zu B for all_reduce / "
                "reduce_scatter / all_gather), progress thread %s, GLIBC_TUNABLES=%s\n",
                n, comm.num_nodes(), comm.shm_enabled() ? "on" : "off", o.shm_chunk_bytes >> 10, o.shm_min_all_reduce,
                o.shm_min_reduce_scatter, o.shm_min_all_gather, comm.uses_progress_thread() ? "on" : "off", tun ? tun : "(unset)");
    std::printf("%-14s %6s %10s %8s %8s %7s %10s %8s %7s %9s %9s\n", "collective", "size", "time_us", "algbw", "busbw",
                "#wrong", "mpi_us", "mpi_bus", "ratio", "best_rat", "memcpy");
    std::printf("%-14s %6s %10s %8s %8s %7s %10s %8s %7s %9s %9s\n", "", "", "", "GB/s", "GB/s", "", "", "GB/s", "x", "x", "GB/s");
  }

  const char* names[] = {"all_reduce", "reduce_scatter", "all_gather"};
  for (std::size_t bytes = min_b; bytes <= max_b; bytes *= 2) {
    const std::size_t elems = bytes / 4;
    if (elems % n) continue;
    // memcpy bandwidth at this size (read + write of `bytes`, counted once as nccl-tests' algbw)
    double tm = timed(MPI_COMM_SELF, 1, 5, nullptr, [&] { std::memcpy(S, P, bytes); });
    const double memcpy_gbs = bytes / tm / 1e9;
    for (int c = 0; c < 3; ++c) {
      if (!only.empty() && only != names[c]) continue;
      const std::size_t blk = elems / n;
      std::function<void()> prepare, ours, raw;
      double factor = double(n - 1) / n;
      if (c == 0) {
        factor *= 2;
        prepare = [&] { std::memcpy(W, P, bytes); };
        ours = [&] { comm.all_reduce({W, elems, ds::DType::F32}, ds::ReduceOp::Sum); };
        raw = [&] { MPI_Allreduce(MPI_IN_PLACE, W, int(elems), MPI_FLOAT, MPI_SUM, ctx.mpi_comm); };
      } else if (c == 1) {
        ours = [&] { comm.reduce_scatter({P, elems, ds::DType::F32}, {W, blk, ds::DType::F32}, ds::ReduceOp::Sum); };
        raw = [&] { MPI_Reduce_scatter_block(P, W, int(blk), MPI_FLOAT, MPI_SUM, ctx.mpi_comm); };
      } else {
        ours = [&] { comm.all_gather({P, blk, ds::DType::F32}, {W, elems, ds::DType::F32}); };
        raw = [&] { MPI_Allgather(P, int(blk), MPI_FLOAT, W, int(blk), MPI_FLOAT, ctx.mpi_comm); };
      }
      // Repeats from a first estimate, so each size costs about `budget` seconds.
      const double t1 = timed(ctx.mpi_comm, 0, 1, prepare, raw);
      int reps = std::clamp(int(budget / std::max(t1, 1e-6)), 3, 50);
      MPI_Bcast(&reps, 1, MPI_INT, 0, ctx.mpi_comm);
      double best_mpi = 0, best_ours = 0;
      const double t_mpi = timed(ctx.mpi_comm, warmup, reps, prepare, raw, &best_mpi);
      const double t_ours = timed(ctx.mpi_comm, warmup, reps, prepare, ours, &best_ours);
      // correctness of our result (the last repeat's output is in W)
      long long wrong = 0;
      if (c == 0) {
        for (std::size_t i = 0; i < elems; ++i) {
          float s = 0;
          for (int q = 0; q < n; ++q) s += value(q, i);
          wrong += W[i] != s;
        }
      } else if (c == 1) {
        for (std::size_t i = 0; i < blk; ++i) {
          float s = 0;
          for (int q = 0; q < n; ++q) s += value(q, r * blk + i);
          wrong += W[i] != s;
        }
      } else {
        for (int q = 0; q < n; ++q)
          for (std::size_t i = 0; i < blk; ++i) wrong += W[q * blk + i] != value(q, i);
      }
      long long total_wrong = 0;
      MPI_Reduce(&wrong, &total_wrong, 1, MPI_LONG_LONG, MPI_SUM, 0, ctx.mpi_comm);
      if (r == 0) {
        const double alg = bytes / t_ours / 1e9, alg_mpi = bytes / t_mpi / 1e9;
        std::printf("%-14s %6s %10.1f %8.2f %8.2f %7lld %10.1f %8.2f %7.2f %9.2f %9.2f\n", names[c], human(bytes).c_str(),
                    t_ours * 1e6, alg, alg * factor, total_wrong, t_mpi * 1e6, alg_mpi * factor, t_mpi / t_ours,
                    best_mpi / best_ours, memcpy_gbs);
        std::fflush(stdout);
      }
    }
  }
  ds::finalize_distributed(ctx);
  return 0;
}
