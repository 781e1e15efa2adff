// train: the main job. `mpirun -np N train --config ds_config.json [flags]`
// (docs/user/training.md). Every failure ends as one `train: error: ...` line on stderr and a
// non-zero exit of the whole job.
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>

#include <mpi.h>

#include "ds/core/env.h"
#include "ds/mpi/init.h"
#include "options.h"
#include "train_loop.h"

namespace {

// Collective: the lowest rank whose `error` is non-empty, or -1 when it is empty everywhere.
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

  // Ranks usually parse the same argv, but an MPMD launch (`mpirun -np 1 train ... : -np 1
  // train ...`) gives each its own: agree on the verdict like any other setup error.
  const std::string parse_error = parsed.message_is_error ? parsed.message : std::string();
  if (int bad = first_failed_rank(parse_error, dist); bad >= 0) {
    if (dist.rank == bad) std::fprintf(stderr, "train: error: %s\n", parse_error.c_str());
    std::fflush(nullptr);
    ds::finalize_distributed(dist);
    return 2;
  }
  // --help (on any rank): the lowest such rank prints it, every rank exits 0.
  const std::string help = parsed.options ? std::string() : parsed.message;
  if (int asker = first_failed_rank(help, dist); asker >= 0) {
    if (dist.rank == asker) std::fputs(help.c_str(), stdout);
    std::fflush(nullptr);
    ds::finalize_distributed(dist);
    return 0;
  }

  // Phase 1 (no communication): config, model, data. Errors are agreed on, then reported
  // once by the lowest failing rank.
  ds::train::JobPtr job;
  std::string error;
  try {
    ds::env::check_all();  // a bad DS_* value: one agreed error line before any work
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

  // Ranks started with different flags, configs or data would run mismatched collectives
  // (undefined behaviour, typically memory corruption): compare fingerprints first.
  {
    const std::uint64_t fp = ds::train::job_fingerprint(*job);
    std::uint64_t in[2] = {fp, ~fp}, out[2] = {0, 0};
    if (MPI_Allreduce(in, out, 2, MPI_UINT64_T, MPI_MIN, dist.mpi_comm) != MPI_SUCCESS)
      ds::abort_job(1, "train: error: MPI_Allreduce failed");
    if (out[0] != ~out[1]) {  // min != max
      if (dist.rank == 0)
        std::fprintf(stderr,
                     "train: error: the ranks disagree on the job (config, model shape, run length or data; "
                     "rank 0 has %s): start every rank with the same flags, config file and data\n",
                     ds::train::job_summary(*job).c_str());
      std::fflush(nullptr);
      job.reset();
      ds::finalize_distributed(dist);
      return 1;
    }
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
