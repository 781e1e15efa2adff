// --load_dir: continue a run from a train checkpoint.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <random>

#include "ds/data/sampler.h"
#include "ds/engine/engine.h"
#include "job.h"

namespace ds::train {

// Collective. The engine restores parameters, optimizer, scheduler and counters; the client
// state gives the step, the sampler position (rescaled when saved with another global
// micro-batch) and the RNG. Returns the step the checkpoint ends at; 0 without --load_dir.
// `load`: how the checkpoint is loaded (default: engine.load_checkpoint; a pipeline's own).
using CheckpointLoad = std::function<std::optional<std::pair<std::string, io::StateValue>>(
    const std::string& dir, std::optional<std::string> tag, const LoadOptions& options)>;
std::int64_t resume(const Job& j, Engine& engine, data::DistributedSampler& train_sampler, std::mt19937_64& rng, int world_size,
                    bool rank0, const CheckpointLoad& load = nullptr);

// What a train checkpoint's client state holds for resume(): the step, the sampler position
// and the global micro-batch it counts in (micro batch x data-parallel ranks), the RNG, the
// seed, the model and the data it trained on.
io::StateValue train_client_state(const Job& j, std::int64_t step, const data::DistributedSampler& train_sampler,
                                  std::int64_t global_micro_batch, const std::mt19937_64& rng);

}  // namespace ds::train
