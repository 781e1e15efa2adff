#include "ds/data/feature_loader.h"

#include <utility>

namespace ds::data {

std::size_t FeatureSource::numel(std::span<const std::int64_t> shape) {
  std::size_t n = 1;
  for (const std::int64_t d : shape) n *= std::size_t(d);
  return n;
}

FeatureLoader::FeatureLoader(const FeatureSource& data, DistributedSampler sampler)
    : data_(&data), sampler_(std::move(sampler)) {
  const auto in = data.sample_shape(), tg = data.target_shape();
  sample_shape_.assign(in.begin(), in.end());
  target_shape_.assign(tg.begin(), tg.end());
  const std::size_t mb = sampler_.micro_batch();
  features_.resize(mb * data.sample_numel());
  if (data.integer_targets())
    targets_.resize(mb * data.target_numel());
  else
    target_values_.resize(mb * data.target_numel());
}

Batch FeatureLoader::next() {
  const auto idx = sampler_.next();
  data_->read(idx, features_.data(), target_values_.data(), targets_.data());
  const std::size_t n = idx.size();
  Batch b;
  b.batch = std::int64_t(n);
  b.feature_dim = std::int64_t(data_->sample_numel());
  b.features = std::span<const float>(features_).first(n * data_->sample_numel());
  if (data_->integer_targets())
    b.targets = std::span<const std::int32_t>(targets_).first(n * data_->target_numel());
  else
    b.target_values = std::span<const float>(target_values_).first(n * data_->target_numel());
  b.sample_shape = sample_shape_;
  b.target_shape = target_shape_;
  return b;
}

}  // namespace ds::data
