// Validation of the client state train saves with a checkpoint (step, sampler position, RNG,
// model description). The state tree is not checksummed, so its values are checked before the
// engine applies anything: the errors name the checkpoint and the field.
#pragma once

#include <cstdint>
#include <string>

#include "ds/io/state_value.h"

namespace ds::train {

struct ResumeExpect {
  std::string model;                    // ModelSpec::describe() of this run
  std::uint64_t steps_per_epoch = 0;    // the training sampler's micro-batches per epoch (this rank)
  std::int64_t global_micro_batch = 0;  // sequences per micro-step in this run (all ranks)
};

// ds::Error "checkpoint <dir>: client state '<field>' ..." on a missing, mistyped or out of
// range field, or when the checkpoint was saved from another model (when it says which).
void check_client_state(const io::StateValue& cs, const std::string& dir, const ResumeExpect& expect);

// The saved sampler step in this run's micro-batches (the same fraction of the epoch when the
// sequences per micro-step changed).
std::uint64_t rescaled_sampler_step(std::int64_t step, std::int64_t saved_global_micro_batch,
                                    std::int64_t global_micro_batch);

}  // namespace ds::train
