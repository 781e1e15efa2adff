// train: the main job. `mpirun -np N train --config ds_config.json [flags]`
// (docs/TRAINING.md). Every failure ends as one `train: error: ...` line on stderr and a
// non-zero exit of the whole job.
#include <cstdio>
#include <exception>
#include <string>

#include <mpi.h>

#include "ds/mpi/init.h"
#include "options.h"
#include "train_loop.h"

namespace {

// Collective: the lowest rank whose `error` is non-empty, or -1 when every rank succeeded.
int first_failed_rank(const std::string& error, const ds::DistributedContext& dist) {
  int mine = error.empty() ? dist.world_size : dist.rank;
  int first = dist.world_size;
  if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, dist.mpi_comm) != MPI_SUCCESS)
    ds::abort_job(1, "train: error: " + (error.empty() ? std::string("MPI_Allreduce failed") : error));
  return first < dist.world_size ? first : -1;
}

}  // namespace

int main(int argc, char** argv) {
  const auto parsed = ds::train::parse_options(argc, argv);

  ds::DistributedContext dist;
  try {
    dist = ds::init_distributed();
  } catch (const std::exception& e) {
    ds::abort_job(1, std::string("train: error: ") + e.what());
  }

  // Every rank parsed the same argv, so they agree on the verdict: rank 0 speaks.
  if (!parsed.options) {
    if (dist.rank == 0) {
      if (parsed.message_is_error)
        std::fprintf(stderr, "train: error: %s\n", parsed.message.c_str());
      else
        std::fputs(parsed.message.c_str(), stdout);
    }
    std::fflush(nullptr);
    ds::finalize_distributed(dist);
    return parsed.exit_code;
  }

  // Phase 1 (no communication): config, model, data. Errors are agreed on, then reported
  // once by the lowest failing rank.
  ds::train::JobPtr job;
  std::string error;
  try {
    job = ds::train::prepare(*parsed.options, dist);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (int bad = first_failed_rank(error, dist); bad >= 0) {
    if (dist.rank == bad) std::fprintf(stderr, "train: error: %s\n", error.c_str());
    std::fflush(nullptr);
    job.reset();
    ds::finalize_distributed(dist);
    return 1;
  }

  // Phase 2 (collective): any error takes the whole job down.
  try {
    ds::train::run(*job, dist);
    job.reset();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    ds::abort_job(1, std::string("train: error: ") + e.what());
  }
  std::fflush(nullptr);
  ds::finalize_distributed(dist);
  return 0;
}
