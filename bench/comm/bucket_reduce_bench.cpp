// bucket_reduce_bench: the ZeRO-1/2 gradient bucket's collective, a reduce of each part to
// the rank whose slice holds it (Communicator::ireduce_scatter_in_place), against the all-reduce of the same
// bucket that every rank would otherwise receive (iall_reduce), on the same MpiComm, in the
// same run. The bucket is cut at two rank slices the way a bucket straddling a slice boundary
// is (--split of it to rank 0, the rest to rank 1, nothing to the others), fp32, sizes 256 KiB
// to --max_mib.
//
// Each row: the median over --repeats of the slowest rank's time for each collective (they
// alternate repeat by repeat, which goes first alternates too). Check: every rank's own block
// equals the expected sum after every timed reduce (small integers: exact). Headline: the
// median over the rows of all-reduce time / reduce-to-slice-rank time (>1: the reduce to the slices' ranks is faster).
// --no_shm: plain MPI (MPI_Ireduce_scatter against MPI_Iallreduce) instead of the window.
//
//   mpirun -np 2 --bind-to none build/bench/comm/bucket_reduce_bench [--max_mib 64] [--no_shm]
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_report.h"
#include "ds/mpi/init.h"
#include "ds/mpi/mpi_comm.h"

namespace {

float value(int r, std::size_t i) { return float(int((i * 7 + std::size_t(r) * 3) % 17) - 8); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO bucket: reduce to the slices' ranks vs all-reduce"};
  double max_mib = 64, split = 0.3;
  int repeats = 15;
  bool no_shm = false;
  std::string min_ratio_s = "0";
  app.add_option("--max_mib", max_mib, "largest bucket (MiB of fp32)")->check(CLI::PositiveNumber);
  app.add_option("--split", split, "share of the bucket in rank 0's slice (the rest: rank 1)")->check(CLI::Range(0.0, 1.0));
  app.add_option("--repeats", repeats, "timed repeats per size")->check(CLI::PositiveNumber);
  app.add_flag("--no_shm", no_shm, "plain MPI instead of the shared-memory window");
  app.add_option("--min_ratio", min_ratio_s, "fail (exit 3) when the headline is below this");
  CLI11_PARSE(app, argc, argv);

  ds::DistributedContext ctx = ds::init_distributed();
  ds::MpiCommOptions o = ds::MpiCommOptions::from_env();
  o.shm = !no_shm;
  ds::MpiComm c(ctx.mpi_comm, o);
  const int r = c.rank(), n = c.size();
  ds::bench::Report report("bucket_reduce_bench");
  report.min_ratio(ds::bench::parse_min_ratio("bucket_reduce_bench", min_ratio_s));

  std::vector<double> ratios;
  std::size_t wrong = 0;
  nlohmann::json rows = nlohmann::json::array();
  if (r == 0)
    std::printf("%d ranks, %s; bucket split %.2f / %.2f between ranks 0 and 1\n%10s %14s %14s %8s\n", n,
                no_shm ? "plain MPI" : "shared-memory window (where it applies)", split, 1 - split, "MiB",
                "all_reduce ms", "to-rank ms", "ratio");
  for (double mib = 0.25; mib <= max_mib + 1e-9; mib *= 4) {
    const std::size_t count = std::size_t(mib * (1 << 20) / sizeof(float));
    std::vector<std::size_t> blocks(std::size_t(n), 0);
    blocks[0] = std::size_t(double(count) * split);
    if (n > 1) blocks[1] = count - blocks[0];
    else blocks[0] = count;
    const std::size_t own = r == 0 ? 0 : blocks[0];
    std::vector<float> buf(count);
    auto fill = [&] {
      for (std::size_t i = 0; i < count; ++i) buf[i] = value(r, i);
    };
    std::vector<double> t_all, t_slice;
    for (int rep = -2; rep < repeats; ++rep) {  // two untimed warm-ups
      for (int k = 0; k < 2; ++k) {
        const bool to_slice = (k == 0) == (rep % 2 == 0);
        fill();
        MPI_Barrier(ctx.mpi_comm);
        const double t0 = MPI_Wtime();
        ds::TensorView v{buf.data(), count, ds::DType::F32};
        if (to_slice) c.ireduce_scatter_in_place(v, blocks, ds::ReduceOp::Sum)->wait();
        else c.iall_reduce(v, ds::ReduceOp::Sum)->wait();
        double dt = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, ctx.mpi_comm);
        for (std::size_t i = own; i < own + blocks[std::size_t(r)]; ++i) {
          float want = 0;
          for (int q = 0; q < n; ++q) want += value(q, i);
          wrong += buf[i] != want;
        }
        if (rep >= 0) (to_slice ? t_slice : t_all).push_back(dt);
      }
    }
    const double a = ds::bench::median(t_all), b = ds::bench::median(t_slice);
    ratios.push_back(a / b);
    rows.push_back({{"mib", mib}, {"all_reduce_s", a}, {"to_slice_ranks_s", b}});
    if (r == 0) std::printf("%10.2f %14.3f %14.3f %8.2f\n", mib, a * 1e3, b * 1e3, a / b);
  }
  unsigned long long wrong_all = wrong;
  MPI_Allreduce(MPI_IN_PLACE, &wrong_all, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, ctx.mpi_comm);
  report["ranks"] = n;
  report["shm"] = !no_shm;
  report["split"] = split;
  report["rows"] = rows;
  report.check("each rank's block equals the expected sum after every reduce", wrong_all == 0,
               std::to_string(wrong_all) + " wrong elements");
  report.headline("all-reduce time / reduce-to-slice-rank time, median over sizes", ds::bench::median(ratios));
  const int code = report.finish(r == 0);
  ds::finalize_distributed(ctx);
  return code;
}
