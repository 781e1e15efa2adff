// The two phases of a training job.
//
// prepare(): everything that needs no communication -- the config, the model shape, the data
// files, the model object. An error here is local to a rank; main() agrees on it across ranks
// (one MPI_Allreduce) so the job ends cleanly with one error line.
//
// run(): ds::initialize and the training loop. Collective from the first call on: an error
// on any rank ends the job with ds::abort_job (MPI_Abort), so no rank is left in a collective.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ds/mpi/init.h"
#include "options.h"

namespace ds::train {

struct Job;
struct JobDeleter { void operator()(Job* j) const; };
using JobPtr = std::unique_ptr<Job, JobDeleter>;

JobPtr prepare(const TrainOptions& opts, const DistributedContext& dist);
// What every rank must agree on (resolved config, model shape, run length, data contents),
// hashed; and the same in words for the error message when ranks disagree.
std::uint64_t job_fingerprint(const Job& job);
std::string job_summary(const Job& job);
void run(Job& job, DistributedContext& dist);

}  // namespace ds::train
