#include "ds/data/sampler.h"

#include <algorithm>
#include <exception>
#include <numeric>

#include "ds/core/error.h"

namespace ds::data {

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
}  // namespace

DistributedSampler::DistributedSampler(std::size_t num_samples, int world_size, int rank,
                                       std::size_t micro_batch, bool shuffle, std::uint64_t seed,
                                       bool drop_last)
    : n_(num_samples), world_(world_size), rank_(rank), micro_batch_(micro_batch),
      shuffle_(shuffle), drop_last_(drop_last), seed_(seed) {
  DS_CHECK(world_size > 0 && rank >= 0 && rank < world_size,
           "DistributedSampler: rank " << rank << " outside world size " << world_size);
  DS_CHECK(micro_batch > 0, "DistributedSampler: micro batch must be > 0");
  const std::size_t W = std::size_t(world_size);
  per_rank_ = drop_last ? n_ / W : (n_ + W - 1) / W;
  steps_per_epoch_ = drop_last ? per_rank_ / micro_batch : (per_rank_ + micro_batch - 1) / micro_batch;
  DS_CHECK(steps_per_epoch_ > 0,
           "DistributedSampler: " << n_ << " samples are not enough for one micro-batch of "
                                  << micro_batch << " on each of " << world_size << " ranks"
                                  << (drop_last ? " (dataloader_drop_last is true)" : ""));
  batch_.reserve(std::min(micro_batch, per_rank_));  // a batch never holds more than this rank's share
}

std::vector<std::size_t> DistributedSampler::epoch_indices(std::uint64_t epoch) const {
  std::vector<std::size_t> perm(n_);
  std::iota(perm.begin(), perm.end(), std::size_t{0});
  if (shuffle_) {
    // Fisher-Yates with a (seed, epoch) stream: the same order on every platform.
    std::uint64_t s = seed_ * 0xD1B54A32D192ED03ull + epoch * 0x9E3779B97F4A7C15ull + 0x1234567ull;
    for (std::size_t i = n_; i > 1; --i) {
      const std::size_t j = std::size_t(splitmix64(s) % i);
      std::swap(perm[i - 1], perm[j]);
    }
  }
  const std::size_t total = per_rank_ * std::size_t(world_);
  if (total < n_) perm.resize(total);                          // drop_last: cut the tail
  for (std::size_t i = 0; perm.size() < total; ++i) perm.push_back(perm[i % n_]);  // pad
  std::vector<std::size_t> mine;
  mine.reserve(per_rank_);
  for (std::size_t i = std::size_t(rank_); i < total; i += std::size_t(world_)) mine.push_back(perm[i]);
  return mine;
}

void DistributedSampler::load_epoch(std::uint64_t epoch) {
  if (loaded_epoch_ == epoch) return;
  mine_ = epoch_indices(epoch);
  loaded_epoch_ = epoch;
}

std::span<const std::size_t> DistributedSampler::next() {
  if (state_.step >= steps_per_epoch_) {
    state_.epoch += 1;
    state_.step = 0;
  }
  load_epoch(state_.epoch);
  const std::size_t begin = std::size_t(state_.step) * micro_batch_;
  const std::size_t end = std::min(begin + micro_batch_, mine_.size());
  batch_.assign(mine_.begin() + std::ptrdiff_t(begin), mine_.begin() + std::ptrdiff_t(end));
  state_.step += 1;
  return batch_;
}

void DistributedSampler::set_state(const SamplerState& s) {
  DS_CHECK(s.step <= steps_per_epoch_, "DistributedSampler: state step " << s.step
                                           << " exceeds steps per epoch " << steps_per_epoch_);
  state_ = s;
}

void DistributedSampler::skip_to_step(std::uint64_t step) {
  state_.epoch = step / steps_per_epoch_;
  state_.step = step % steps_per_epoch_;
}

Loader::Loader(const WindowSource& data, std::int64_t seq, DistributedSampler sampler)
    : data_(&data), seq_(seq), micro_batch_(sampler.micro_batch()), sampler_(std::move(sampler)) {
  DS_CHECK(seq > 0, "Loader: sequence length must be > 0");
  // An absurd micro-batch (1e8 sequences) must say which allocation failed and why, not
  // "std::bad_alloc".
  std::size_t tokens = 0;
  const bool overflow = __builtin_mul_overflow(micro_batch_, std::size_t(seq), &tokens);
  const double gib = double(micro_batch_) * double(seq) * 2 * sizeof(std::int32_t) / double(1ull << 30);
  try {
    DS_CHECK(!overflow && tokens <= inputs_.max_size(), "size overflow");
    inputs_.resize(tokens);
    targets_.resize(tokens);
  } catch (const std::exception&) {
    inputs_ = {};
    targets_ = {};
    DS_THROW("data loader: out of host memory allocating the micro-batch buffers (micro-batch "
             << micro_batch_ << " sequences x " << seq << " tokens, inputs and targets: " << gib
             << " GiB); lower train_micro_batch_size_per_gpu");
  }
}

Batch Loader::next() { return next(inputs_, targets_); }

Batch Loader::next(std::span<std::int32_t> inputs, std::span<std::int32_t> targets) {
  const std::size_t need = micro_batch_ * std::size_t(seq_);
  DS_CHECK(inputs.size() >= need && targets.size() >= need,
           "Loader::next: buffers must hold micro_batch*seq = " << need << " tokens");
  auto idx = sampler_.next();
  for (std::size_t b = 0; b < idx.size(); ++b)
    data_->sample(idx[b], seq_, inputs.data() + b * std::size_t(seq_), targets.data() + b * std::size_t(seq_));
  Batch batch;
  const std::size_t n = idx.size() * std::size_t(seq_);
  batch.inputs = inputs.first(n);
  batch.targets = targets.first(n);
  batch.batch = std::int64_t(idx.size());
  batch.seq = seq_;
  return batch;
}

}  // namespace ds::data
