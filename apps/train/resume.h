// --load_dir: continue a run from a train checkpoint.
#pragma once

#include <cstdint>
#include <random>

#include "ds/data/sampler.h"
#include "ds/engine/engine.h"
#include "job.h"

namespace ds::train {

// Collective. The engine restores parameters, optimizer, scheduler and counters; the client
// state gives the step, the sampler position (rescaled when saved with another global
// micro-batch) and the RNG. Returns the step the checkpoint ends at; 0 without --load_dir.
std::int64_t resume(const Job& j, Engine& engine, data::DistributedSampler& train_sampler, std::mt19937_64& rng, int world_size,
                    bool rank0);

}  // namespace ds::train
