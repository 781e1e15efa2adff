// DistributedSampler + Loader: what DeepSpeed's dataloader does (torch's DistributedSampler
// under a DataLoader with drop_last = dataloader_drop_last), resumable at an exact step.
//
// Each epoch the sample indices 0..n-1 are permuted with (seed, epoch) (or kept in order when
// shuffle is off). Then, as torch.utils.data.DistributedSampler:
//   drop_last = true : the tail is cut to a multiple of world size; the per-rank shards are
//                      disjoint. The batcher drops the last partial micro-batch.
//   drop_last = false: the permutation is padded by repeating its first indices up to a
//                      multiple of world size (at most world-1 samples seen twice per epoch),
//                      and the last micro-batch of an epoch may be smaller than micro_batch.
// Rank r takes positions r, r+W, r+2W, ... of the (cut or padded) permutation. Every rank
// has the same number of steps per epoch, so collectives stay matched.
//
// State = (epoch, step within the epoch); skip_to_step(global_step) jumps there directly
// (DeepSpeed's dataloader_to_step), so a resumed run sees exactly the batches it would have.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ds/core/module.h"
#include "ds/data/dataset.h"

namespace ds::data {

struct SamplerState {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;  // micro-batches already taken in this epoch
};

class DistributedSampler {
 public:
  DistributedSampler(std::size_t num_samples, int world_size, int rank, std::size_t micro_batch,
                     bool shuffle = true, std::uint64_t seed = 0, bool drop_last = false);

  // Indices of this rank's next micro-batch (valid until the next call); moves on to the next
  // epoch (reshuffled) after the last micro-batch of an epoch.
  std::span<const std::size_t> next();

  std::size_t steps_per_epoch() const { return steps_per_epoch_; }
  std::size_t samples_per_rank() const { return per_rank_; }
  std::size_t micro_batch() const { return micro_batch_; }
  SamplerState state() const { return state_; }
  void set_state(const SamplerState& s);
  // Positions the sampler so the next micro-batch is global micro-batch number `step`
  // (0-based, counted from epoch 0).
  void skip_to_step(std::uint64_t step);
  // This rank's indices for an epoch, in order (for tests and inspection).
  std::vector<std::size_t> epoch_indices(std::uint64_t epoch) const;

 private:
  void load_epoch(std::uint64_t epoch);

  std::size_t n_;
  int world_, rank_;
  std::size_t micro_batch_;
  bool shuffle_, drop_last_;
  std::uint64_t seed_;
  std::size_t per_rank_ = 0, steps_per_epoch_ = 0;
  SamplerState state_;
  std::uint64_t loaded_epoch_ = ~std::uint64_t(0);
  std::vector<std::size_t> perm_, mine_, batch_;
};

// What a training loop pulls micro-batches from: token windows (Loader, below) or feature
// arrays (FeatureLoader, ds/data/feature_loader.h). A Batch is valid until the next call.
class BatchLoader {
 public:
  virtual ~BatchLoader() = default;
  virtual Batch next() = 0;
  virtual DistributedSampler& sampler() = 0;

 protected:
  BatchLoader() = default;
  BatchLoader(const BatchLoader&) = default;
  BatchLoader(BatchLoader&&) = default;
  BatchLoader& operator=(const BatchLoader&) = default;
  BatchLoader& operator=(BatchLoader&&) = default;
};

// Yields ds::Batch micro-batches of (B, seq) windows from a WindowSource (a TextDataset or
// TokenShards, which must outlive the loader: it is not copied), through a
// DistributedSampler. The token buffers are allocated once and reused: a Batch is valid
// until the next call. The last micro-batch of an epoch may be smaller (drop_last = false).
class Loader : public BatchLoader {
 public:
  Loader(const WindowSource& data, std::int64_t seq, DistributedSampler sampler);

  // Next micro-batch into the loader's own buffers.
  Batch next() override;
  // Next micro-batch into caller-owned buffers (at least micro_batch*seq each).
  Batch next(std::span<std::int32_t> inputs, std::span<std::int32_t> targets);

  DistributedSampler& sampler() override { return sampler_; }
  const DistributedSampler& sampler() const { return sampler_; }
  std::int64_t seq() const { return seq_; }

 private:
  const WindowSource* data_;
  std::int64_t seq_;
  std::size_t micro_batch_;
  DistributedSampler sampler_;
  std::vector<std::int32_t> inputs_, targets_;
};

}  // namespace ds::data
