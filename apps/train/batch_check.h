// Checks of the micro-batch made before training starts (prepare(), no communication):
// one larger than a rank's share of the data, which the sampler fills by taking the whole
// share every micro-step (a warning), and a working set this machine's memory cannot hold,
// where the kernel's OOM killer would end the rank without a word once the lazily allocated
// pages were touched (an error naming the key and the figures).
#pragma once

#include <cstdint>
#include <string>

#include "ds/config/ds_config.h"
#include "ds/core/module.h"
#include "ds/engine/memory.h"
#include "host_memory.h"

namespace ds::train {

struct BatchPlan {
  std::int64_t micro_batch = 0;   // train_micro_batch_size_per_gpu
  std::int64_t seq = 0;           // block_size: tokens per sequence
  std::size_t train_samples = 0;  // training windows in the data, all ranks together
  int world_size = 1;
  int ranks_here = 1;             // ranks on this machine: they share its memory
  bool on_gpu = false;            // the model's states and activations live on the GPU
  std::string data_name;          // "the embedded corpus" or the --data path
  // Sequences one micro-batch of a rank really holds: the micro-batch, or this rank's share
  // of the data when that is smaller (the sampler without drop_last: ceil(samples / ranks)).
  std::int64_t sequences_per_micro_batch() const;
};

// The warning for a micro-batch larger than a rank's share of the data (every micro-step then
// takes the whole share: one epoch per micro-step), or "" when the data fills it.
std::string micro_batch_repeat_warning(const BatchPlan& plan);

// Host memory one rank needs while training, estimated from the model and the config: a lower
// bound (allocator overheads, communication scratch and the validation loader are left out),
// so a job it refuses could not have run.
struct WorkingSet {
  double activations = 0;    // the model's activation arena for one micro-batch
  double batch_buffers = 0;  // the data loader's inputs and targets (mlp: + the one-hot features)
  engine::ModelStateBytes states;  // ZeRO paper accounting; what NVMe offload moves to disk is left out
  double total() const;
  std::string describe() const;  // "activations 1.2 GiB, micro-batch buffers ..., parameters ..."
};

WorkingSet estimate_working_set(const config::DsConfig& cfg, const Module& model, const BatchPlan& plan);

// ds::Error naming train_micro_batch_size_per_gpu, the estimate (per rank and for this
// machine's ranks) and the memory available, when the ranks here need more than `available`.
void check_working_set(const WorkingSet& need, const BatchPlan& plan, const HostMemory& available);

// Both checks for the train app: the warning on stderr (when print_warning: rank 0), then the
// memory check (skipped where the available memory cannot be read).
void check_micro_batch(const config::DsConfig& cfg, const Module& model, const BatchPlan& plan, bool print_warning);

}  // namespace ds::train
