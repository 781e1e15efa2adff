// run() for a pipeline-parallel job (pipeline.stages > 1): the layers split over a stages x
// data grid and trained by ds::pipe::PipeEngine, with the same progress output, validation,
// monitors, checkpoints, resume and summary as a data-parallel run.
#pragma once

#include "ds/mpi/init.h"
#include "job.h"

namespace ds::train {

void run_pipelined(Job& j, DistributedContext& dist);

}  // namespace ds::train
