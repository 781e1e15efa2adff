// Training data from an HDF5 file: an inputs array and a targets array (datasets of the file,
// by name), whose first axis is the sample. Inputs of any integer or floating-point type are
// read as float32 features; integer targets as int32 class ids, floating-point ones as
// float32 values. A sample is read only when a loader asks for it (each rank reads its own).
// Library ds_data_hdf5 (ds_data + ds_io): ds_data itself needs no HDF5.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ds/data/feature_loader.h"
#include "ds/io/h5_array.h"

namespace ds::data {

class Hdf5Dataset : public FeatureSource {
 public:
  // Opens `path` and checks the two datasets; ds::Error naming the file and the dataset for a
  // missing file (or one that is not HDF5), a missing dataset, a scalar (0-D) one, an element
  // type that is not a number (strings, compound records, enums), no samples, or first axes
  // of different lengths.
  static Hdf5Dataset open(const std::string& path, const std::string& inputs, const std::string& targets);

  // (train, validation): validation is the last `val_fraction` of the samples (at least
  // `min_val` when val_fraction > 0, never all of them), train the samples before it.
  std::pair<Hdf5Dataset, Hdf5Dataset> split(double val_fraction, std::size_t min_val) const;

  std::size_t num_samples() const override { return count_; }
  std::span<const std::int64_t> sample_shape() const override { return sample_shape_; }
  std::span<const std::int64_t> target_shape() const override { return target_shape_; }
  bool integer_targets() const override { return targets_.kind == io::ElementKind::Integer; }
  void read(std::span<const std::size_t> indices, float* features, float* target_values,
            std::int32_t* targets) const override;

  // The smallest and largest target of this view's samples (integer targets; reads them all).
  std::pair<std::int32_t, std::int32_t> target_range() const;
  const std::string& path() const { return path_; }
  const std::string& inputs_name() const { return inputs_name_; }
  const std::string& targets_name() const { return targets_name_; }
  // "inputs 'x' float64 [8, 8], targets 'y' int64 (one per sample)" for the log.
  std::string describe() const;
  // The file's shapes and element types (a resume on other data warns).
  std::uint64_t fingerprint() const;

 private:
  std::shared_ptr<const io::H5ArrayFile> file_;
  std::string path_, inputs_name_, targets_name_;
  io::ArrayInfo inputs_, targets_;
  std::vector<std::int64_t> sample_shape_, target_shape_;
  std::size_t first_ = 0, count_ = 0;  // this view's samples: rows [first_, first_ + count_)
};

}  // namespace ds::data
