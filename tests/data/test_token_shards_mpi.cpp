// Two ranks over one set of llm.c shards (rank 0 writes them): with drop_last the ranks'
// windows of an epoch are disjoint and together every window; a rank resumed from its sampler
// state at step k continues with the same windows as the rank that ran straight.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/data/sampler.h"
#include "ds/data/token_shards.h"
#include "shard_files.h"

namespace {
int fails = 0;
int rank = 0;
void check(bool ok, const char* what) {
  if (!ok) {
    ++fails;
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", rank, what);
  }
}

// The first input token of each window in the next `steps` micro-batches (tokens are unique,
// so it names the window), after checking the window lies in one shard.
std::vector<std::int32_t> take(ds::data::Loader& l, int steps) {
  std::vector<std::int32_t> firsts;
  for (int s = 0; s < steps; ++s) {
    ds::Batch b = l.next();
    for (std::int64_t i = 0; i < b.batch; ++i) {
      const std::int32_t* in = b.inputs.data() + i * b.seq;
      const std::int32_t* tg = b.targets.data() + i * b.seq;
      for (std::int64_t t = 0; t < b.seq; ++t) check(tg[t] == in[t] + 1 && tg[t] / 100000 == in[0] / 100000, "window within one shard");
      firsts.push_back(in[0]);
    }
  }
  return firsts;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  char dir[64] = "/tmp/ds_shards_mpi_XXXXXX";
  if (rank == 0) {
    if (!::mkdtemp(dir)) MPI_Abort(MPI_COMM_WORLD, 1);
    for (int f = 0; f < 3; ++f) {
      std::vector<std::uint32_t> t(200 + 57 * std::size_t(f));
      for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::uint32_t(100000 * f + int(i));
      write_llmc_shard(std::string(dir) + "/train_00000" + std::to_string(f) + ".bin", t, 2);
    }
  }
  MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  try {
    const auto data = ds::data::TokenShards::open(std::string(dir) + "/train_*.bin");
    const std::int64_t T = 16;
    const std::size_t n = data.num_samples(T);
    check(n == 12 + 16 + 19, "windows per shard: 199/16 + 256/16 + 313/16");
    ds::data::Loader one_epoch(data, T, ds::data::DistributedSampler(n, world, rank, 4, true, 3, true));
    const int steps = int(one_epoch.sampler().steps_per_epoch());
    std::vector<std::int32_t> mine = take(one_epoch, steps);
    // Every rank's windows of the epoch, gathered: disjoint across ranks.
    std::vector<std::int32_t> all(mine.size() * std::size_t(world));
    MPI_Allgather(mine.data(), int(mine.size()), MPI_INT, all.data(), int(mine.size()), MPI_INT, MPI_COMM_WORLD);
    check(std::set<std::int32_t>(all.begin(), all.end()).size() == all.size(), "ranks read disjoint windows");
    check(all.size() == (n / std::size_t(world)) / 4 * 4 * std::size_t(world), "every rank reads its full share");

    // Straight vs saved at k and resumed in a new loader (as a checkpoint does), past an epoch.
    ds::data::Loader straight(data, T, ds::data::DistributedSampler(n, world, rank, 4, true, 3, true));
    const auto want = take(straight, 2 * steps + 1);
    ds::data::Loader part(data, T, ds::data::DistributedSampler(n, world, rank, 4, true, 3, true));
    auto got = take(part, steps - 1);
    const ds::data::SamplerState saved = part.sampler().state();
    ds::data::Loader resumed(data, T, ds::data::DistributedSampler(n, world, rank, 4, true, 3, true));
    resumed.sampler().set_state(saved);
    const auto rest = take(resumed, steps + 2);
    got.insert(got.end(), rest.begin(), rest.end());
    check(got == want, "resume at step k gives the same windows as running straight");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] FAIL: %s\n", rank, e.what());
    ++fails;
  }
  int total = 0;
  MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    std::filesystem::remove_all(dir);
    std::printf(total == 0 ? "PASS\n" : "FAILED\n");
  }
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
