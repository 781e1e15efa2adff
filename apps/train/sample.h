// The text sample printed after training.
#pragma once

#include <cstdint>

#include "job.h"

namespace ds::train {

// A short sample from the trained model (one with a sampler), printed by rank 0, prompted by
// --prompt or the start of the validation split. `on_this_rank`: below ZeRO stage 3 rank 0
// holds the whole model and samples alone; at stage 3 every rank runs the sampler, because
// each of its forward calls gathers the parameter groups from every rank.
void print_sample(const Job& j, bool on_this_rank, bool rank0, std::uint64_t sample_seed);

}  // namespace ds::train
