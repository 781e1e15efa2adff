#include "ds/data/hdf5_dataset.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <sstream>

#include "ds/core/error.h"
#include "ds/core/hash.h"

namespace ds::data {

namespace {

std::string shape_text(std::span<const std::int64_t> shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

// The dataset `name` of `file`, checked: it exists, holds numbers, has a first axis of samples.
io::ArrayInfo checked_array(const io::H5ArrayFile& file, const std::string& name, const char* role) {
  const std::string& path = file.path();
  DS_CHECK(file.is_dataset(name), "HDF5 file " << path << " has no dataset '" << name << "' (the " << role
                                               << " array)");
  io::ArrayInfo info = file.info(name);
  DS_CHECK(info.kind != io::ElementKind::Other,
           "HDF5 file " << path << " dataset '" << name << "' (the " << role << " array) holds " << info.type_name
                        << " elements; train reads integer or floating-point arrays");
  DS_CHECK(!info.shape.empty(), "HDF5 file " << path << " dataset '" << name << "' (the " << role
                                             << " array) is a scalar (0-D); it needs a first axis of samples");
  DS_CHECK(info.shape[0] > 0, "HDF5 file " << path << " dataset '" << name << "' (the " << role
                                           << " array) holds no samples: its shape is " << shape_text(info.shape));
  return info;
}

}  // namespace

Hdf5Dataset Hdf5Dataset::open(const std::string& path, const std::string& inputs, const std::string& targets) {
  DS_CHECK(std::filesystem::exists(path), "HDF5 file " << path << " does not exist");
  Hdf5Dataset d;
  d.file_ = std::make_shared<const io::H5ArrayFile>(path);
  d.path_ = path;
  d.inputs_name_ = inputs;
  d.targets_name_ = targets;
  d.inputs_ = checked_array(*d.file_, inputs, "inputs");
  d.targets_ = checked_array(*d.file_, targets, "targets");
  DS_CHECK(d.inputs_.shape[0] == d.targets_.shape[0],
           "HDF5 file " << path << ": the inputs '" << inputs << "' have " << d.inputs_.shape[0]
                        << " samples (first axis of " << shape_text(d.inputs_.shape) << ") but the targets '"
                        << targets << "' have " << d.targets_.shape[0] << " (first axis of "
                        << shape_text(d.targets_.shape) << ")");
  d.sample_shape_.assign(d.inputs_.shape.begin() + 1, d.inputs_.shape.end());
  d.target_shape_.assign(d.targets_.shape.begin() + 1, d.targets_.shape.end());
  d.count_ = std::size_t(d.inputs_.shape[0]);
  return d;
}

std::pair<Hdf5Dataset, Hdf5Dataset> Hdf5Dataset::split(double val_fraction, std::size_t min_val) const {
  std::size_t val = 0;
  if (val_fraction > 0) {
    val = std::max(std::size_t(std::ceil(val_fraction * double(count_))), min_val);
    val = std::min(val, count_ - 1);  // at least one training sample
  }
  std::pair<Hdf5Dataset, Hdf5Dataset> parts{*this, *this};
  parts.first.count_ = count_ - val;
  parts.second.first_ = first_ + count_ - val;
  parts.second.count_ = val;
  return parts;
}

void Hdf5Dataset::read(std::span<const std::size_t> indices, float* features, float* target_values,
                       std::int32_t* targets) const {
  std::vector<std::size_t> rows(indices.begin(), indices.end());
  for (std::size_t& r : rows) {
    DS_CHECK(r < count_, "HDF5 file " << path_ << ": sample " << r << " beyond the " << count_ << " of this split");
    r += first_;
  }
  file_->read_rows(inputs_name_, rows, features);
  if (integer_targets())
    file_->read_rows(targets_name_, rows, targets);
  else
    file_->read_rows(targets_name_, rows, target_values);
}

std::pair<std::int32_t, std::int32_t> Hdf5Dataset::target_range() const {
  DS_CHECK(integer_targets(), "HDF5 file " << path_ << " dataset '" << targets_name_ << "' holds "
                                           << targets_.type_name << " targets, not integer class ids");
  constexpr std::size_t kRowsPerRead = std::size_t(1) << 16;
  std::pair<std::int32_t, std::int32_t> range{std::numeric_limits<std::int32_t>::max(),
                                              std::numeric_limits<std::int32_t>::min()};
  std::vector<std::int32_t> buf;
  for (std::size_t at = 0; at < count_; at += kRowsPerRead) {
    const std::size_t n = std::min(kRowsPerRead, count_ - at);
    buf.resize(n * target_numel());
    file_->read_row_range(targets_name_, first_ + at, n, buf.data());
    for (const std::int32_t t : buf) range = {std::min(range.first, t), std::max(range.second, t)};
  }
  return range;
}

std::string Hdf5Dataset::describe() const {
  std::ostringstream os;
  os << "inputs '" << inputs_name_ << "' " << inputs_.type_name << ' ' << shape_text(sample_shape_) << ", targets '"
     << targets_name_ << "' " << targets_.type_name << ' '
     << (target_shape_.empty() ? std::string("(one per sample)") : shape_text(target_shape_));
  return os.str();
}

std::uint64_t Hdf5Dataset::fingerprint() const {
  std::uint64_t h = fnv1a64(describe());
  const std::int64_t samples = inputs_.shape[0];
  return fnv1a64(&samples, sizeof samples, h);
}

}  // namespace ds::data
