// The data loaders of a job's splits, for this rank's data-parallel index (j.dp_rank of
// j.dp_size: every rank of a data-parallel run, the rank's pipe in a pipelined one).
#pragma once

#include <memory>

#include "ds/data/sampler.h"
#include "job.h"

namespace ds::train {

// The training split, shuffled by the job's seed (dataloader_drop_last as configured): token
// windows of the text or token files, or the samples of the HDF5 arrays (feature data).
std::unique_ptr<data::BatchLoader> make_train_loader(const Job& j);
// The validation split in order, or null when there is none to validate on (fewer samples
// than data-parallel ranks, or eval_iters 0).
std::unique_ptr<data::BatchLoader> make_val_loader(const Job& j);

}  // namespace ds::train
