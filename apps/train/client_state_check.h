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

// What a run trains on, saved in the client state ("data") so that a resume on other data is
// noticed: the --data value ("the embedded corpus" without it), the token count and a hash of
// the tokens (token files: their sizes and first and last 4 KiB). HDF5 arrays count samples
// (unit "samples", saved as "unit"; a checkpoint without it counted tokens) and hash the
// arrays' names, element types and shapes.
struct DataIdentity {
  std::string source;
  std::int64_t tokens = 0;
  std::uint64_t fingerprint = 0;
  std::string unit = "tokens";
};
io::StateValue data_identity_state(const DataIdentity& data);
// Empty when the checkpoint in `dir` was trained on `here` (same tokens and fingerprint; the
// path may differ) or records no data (saved before it did); otherwise the warning naming
// both.
std::string data_change_warning(const io::StateValue& cs, const std::string& dir, const DataIdentity& here);

// The saved sampler step in this run's micro-batches (the same fraction of the epoch when the
// sequences per micro-step changed).
std::uint64_t rescaled_sampler_step(std::int64_t step, std::int64_t saved_global_micro_batch,
                                    std::int64_t global_micro_batch);

}  // namespace ds::train
