// Feature data -- N-D float samples, each with float or integer targets (an HDF5 file's
// arrays: ds/data/hdf5_dataset.h) -- and the loader that batches it through a
// DistributedSampler, so each rank reads only its own samples and a resume continues with
// exactly the batches of the unbroken run (as the token Loader).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "ds/core/module.h"
#include "ds/data/sampler.h"

namespace ds::data {

class FeatureSource {
 public:
  virtual ~FeatureSource() = default;
  virtual std::size_t num_samples() const = 0;
  // One sample's shape (the array's shape without its first axis); empty: one value.
  virtual std::span<const std::int64_t> sample_shape() const = 0;
  // One sample's targets; empty: one target per sample.
  virtual std::span<const std::int64_t> target_shape() const = 0;
  // Integer targets (class ids, read as int32) or float ones.
  virtual bool integer_targets() const = 0;
  // Samples `indices` (< num_samples, any order): their features one after the other into
  // `features` (sample_numel() floats each), their targets into `targets` when
  // integer_targets(), else into `target_values` (target_numel() each).
  virtual void read(std::span<const std::size_t> indices, float* features, float* target_values,
                    std::int32_t* targets) const = 0;

  std::size_t sample_numel() const { return numel(sample_shape()); }
  std::size_t target_numel() const { return numel(target_shape()); }
  static std::size_t numel(std::span<const std::int64_t> shape);

 protected:
  FeatureSource() = default;
  FeatureSource(const FeatureSource&) = default;
  FeatureSource(FeatureSource&&) = default;
  FeatureSource& operator=(const FeatureSource&) = default;
  FeatureSource& operator=(FeatureSource&&) = default;
};

// Micro-batches of a FeatureSource (which must outlive the loader) into buffers allocated
// once: Batch.features / feature_dim / sample_shape, and Batch.targets (integer targets) or
// Batch.target_values, with target_shape. The last micro-batch of an epoch may be smaller
// (drop_last = false).
class FeatureLoader : public BatchLoader {
 public:
  FeatureLoader(const FeatureSource& data, DistributedSampler sampler);
  Batch next() override;
  DistributedSampler& sampler() override { return sampler_; }

 private:
  const FeatureSource* data_;
  DistributedSampler sampler_;
  std::vector<std::int64_t> sample_shape_, target_shape_;
  std::vector<float> features_, target_values_;
  std::vector<std::int32_t> targets_;
};

}  // namespace ds::data
