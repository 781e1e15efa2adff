// Loading a checkpoint: read_latest and CheckpointReader (manifest and file checks, verified
// and elastic reads straight from the mapped files).
#include "ds/io/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "checkpoint_internal.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/half.h"
#include "ds/core/log.h"
#include "ds/io/checksum.h"
#include "raw_io.h"

namespace fs = std::filesystem;

namespace ds::io {

using detail::hex32;
using detail::is_plain_name;
using detail::kMaxTagBytes;

std::optional<std::string> read_latest(const std::string& load_dir) {
  DS_CHECK(fs::is_directory(load_dir), "checkpoint directory '" << load_dir << "' does not exist");
  fs::path latest = fs::path(load_dir) / kLatestFile;
  if (!fs::exists(latest)) return std::nullopt;
  std::string t = read_regular_file(latest.string(), "checkpoint file");
  auto b = t.find_first_not_of(" \t\r\n");
  auto e = t.find_last_not_of(" \t\r\n");
  DS_CHECK(b != std::string::npos, latest.string() << " is empty");
  t = t.substr(b, e - b + 1);
  // What is echoed is escaped and cut short: a `latest` of random bytes must not put control
  // sequences into the error line.
  DS_CHECK(is_plain_name(t), latest.string() << " names tag '" << printable_excerpt(t)
                                             << "', which is not a plain directory name inside " << load_dir
                                             << " (a tag has no '/' and is not '.' or '..')");
  const bool control = std::any_of(t.begin(), t.end(), [](char c) { return (unsigned char)c < 0x20 || c == 0x7f; });
  DS_CHECK(!control && t.size() <= kMaxTagBytes,
           latest.string() << " does not hold a checkpoint tag: '" << printable_excerpt(t) << "' ("
                           << (control ? "control bytes" : "longer than 255 bytes")
                           << "; dstrain writes the tag's name, as DeepSpeed does)");
  return t;
}

CheckpointReader::CheckpointReader(const std::string& load_dir, const std::string& tag, const LoadOptions& options)
    : io_threads_(options.io_threads) {
  DS_CHECK(fs::is_directory(load_dir), "checkpoint directory '" << load_dir << "' does not exist");
  DS_CHECK(is_plain_name(tag), "checkpoint tag '" << printable_excerpt(tag) << "' is not a plain directory name inside "
                                                  << load_dir << " (a tag has no '/' and is not '.' or '..')");
  dir_ = (fs::path(load_dir) / tag).string();
  if (!fs::is_directory(dir_)) {
    std::ostringstream tags;
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(load_dir)) {
      std::string n = e.path().filename().string();
      if (e.is_directory() && n.find(".tmp-") == std::string::npos) names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) tags << (tags.tellp() ? ", " : "") << n;
    DS_THROW("checkpoint tag '" << printable_excerpt(tag) << "' not found: " << printable_excerpt(dir_, 4096)
                                << " does not exist (tags in " << load_dir << ": "
                                << (names.empty() ? std::string("none") : tags.str()) << ")");
  }
  std::string mpath = (fs::path(dir_) / kManifestFile).string();
  DS_CHECK(fs::exists(mpath), "checkpoint " << dir_ << " has no " << kManifestFile << " (incomplete save or not a dstrain checkpoint)");
  manifest_ = detail::parse_manifest(mpath);
  DS_CHECK(fs::exists(fs::path(dir_) / kModelFile), "checkpoint " << dir_ << ": " << kModelFile << " is missing");
  for (const auto& p : manifest_.partitions)
    DS_CHECK(fs::exists(fs::path(dir_) / p.file), "checkpoint " << dir_ << ": shard " << p.file << " (rank " << p.rank
                                                                << " of " << manifest_.world_size << ") is missing");
  // A rank that saved several ranges has one file named by several partitions.
  for (const auto& p : manifest_.partitions) {
    auto it = std::find(files_.begin(), files_.end(), p.file);
    const std::size_t fi = std::size_t(it - files_.begin());
    if (it == files_.end()) {
      files_.push_back(p.file);
      file_numel_.push_back(0);
    }
    part_file_.push_back(fi);
    file_numel_[fi] = std::max(file_numel_[fi], p.position + p.count);
  }
  shards_.resize(files_.size());
  shard_maps_.resize(files_.size());
}

CheckpointReader::~CheckpointReader() = default;

H5File& CheckpointReader::model_file() {
  if (!model_) model_ = std::make_unique<H5File>((fs::path(dir_) / kModelFile).string(), H5File::Mode::Read);
  return *model_;
}

H5File& CheckpointReader::shard_file(std::size_t fi) {
  if (!shards_[fi]) shards_[fi] = std::make_unique<H5File>((fs::path(dir_) / files_[fi]).string(), H5File::Mode::Read);
  return *shards_[fi];
}

const ManifestParam& CheckpointReader::manifest_param(const std::string& name) const {
  for (const auto& p : manifest_.params)
    if (p.name == name) return p;
  DS_THROW("checkpoint " << dir_ << " (" << kManifestFile << ") has no parameter '" << name << "'");
}

const unsigned char* CheckpointReader::raw_bytes(H5File& f, std::unique_ptr<detail::MappedFile>& map, const std::string& ds,
                                                 std::size_t bytes) {
  auto ext = f.raw_extent(ds);
  if (!ext) return nullptr;
  DS_CHECK(ext->bytes == bytes, f.path() << " dataset '" << ds << "' stores " << ext->bytes << " bytes, expected " << bytes);
  if (!map) map = std::make_unique<detail::MappedFile>(f.path());
  return map->range(ext->offset, ext->bytes, f.path() + " dataset '" + ds + "'");
}

std::uint32_t CheckpointReader::expected_crc(const std::string& file, const std::string& dataset) const {
  auto f = manifest_.checksums.find(file);
  DS_CHECK(f != manifest_.checksums.end(), dir_ << "/" << kManifestFile << " has no checksums for " << file);
  auto d = f->second.find(dataset);
  DS_CHECK(d != f->second.end(), dir_ << "/" << kManifestFile << " has no checksum for " << file << " dataset '" << dataset << "'");
  return d->second;
}

void CheckpointReader::check_model(const std::vector<ExpectedParam>& expected, bool strict) const {
  std::map<std::string, const ManifestParam*> saved;
  for (const auto& p : manifest_.params) saved[p.name] = &p;
  std::vector<std::string> problems;
  bool fatal = false;
  auto shape_str = [](const std::vector<std::int64_t>& s) {
    std::ostringstream os;
    os << "[";
    for (std::size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
    os << "]";
    return os.str();
  };
  std::map<std::string, bool> seen;
  for (const auto& e : expected) {
    seen[e.name] = true;
    auto it = saved.find(e.name);
    if (it == saved.end()) {
      problems.push_back("missing in checkpoint: " + e.name + " " + shape_str(e.shape));
      fatal |= strict;
    } else if (it->second->shape != e.shape) {
      problems.push_back("shape differs: " + e.name + " checkpoint " + shape_str(it->second->shape) + " model " +
                         shape_str(e.shape));
      fatal = true;
    }
  }
  for (const auto& p : manifest_.params) {
    if (!seen.count(p.name)) {
      problems.push_back("unexpected in checkpoint: " + p.name + " " + shape_str(p.shape));
      fatal |= strict;
    }
  }
  if (fatal) {
    std::ostringstream os;
    os << "checkpoint " << dir_ << " (" << kModelFile << ") does not match the model"
       << (strict ? " (load_module_strict)" : "") << ":";
    for (const auto& p : problems) os << "\n  " << p;
    DS_THROW(os.str());
  }
  for (const auto& p : problems) DS_WARN("checkpoint " << dir_ << ": " << p);
}

bool CheckpointReader::same_flat_layout(const std::vector<ExpectedParam>& expected) const {
  if (expected.size() != manifest_.params.size()) return false;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const auto& s = manifest_.params[i];
    if (s.name != expected[i].name || s.shape != expected[i].shape || s.flat_offset != expected[i].flat_offset) return false;
  }
  return true;
}

bool CheckpointReader::holds_flat_layout(const std::vector<ExpectedParam>& expected) const {
  std::map<std::string, const ManifestParam*> saved;
  for (const auto& p : manifest_.params) saved[p.name] = &p;
  for (const auto& e : expected) {
    auto it = saved.find(e.name);
    if (it == saved.end() || it->second->shape != e.shape || it->second->flat_offset != e.flat_offset) return false;
  }
  return true;
}

void CheckpointReader::verify_params(const std::vector<std::string>& names) {
  if (manifest_.params_in_master) {
    // The weights are fp32_master: checksum that dataset of every file holding part of them.
    std::vector<bool> need(files_.size(), false);
    for (const auto& n : names) {
      const ManifestParam& mp = manifest_param(n);
      for (std::size_t i = 0; i < manifest_.partitions.size(); ++i) {
        const auto& p = manifest_.partitions[i];
        if (p.offset < mp.flat_offset + mp.numel && mp.flat_offset < p.offset + p.count) need[part_file_[i]] = true;
      }
    }
    for (std::size_t fi = 0; fi < files_.size(); ++fi)
      if (need[fi]) verify_shard_file(fi, {"fp32_master"});
    return;
  }
  H5File& f = model_file();
  for (const auto& n : names) {
    std::string ds = "params/" + n;
    DatasetInfo di = f.info(ds);
    std::size_t bytes = di.numel() * dtype_size(di.dtype);
    std::uint32_t got = 0;
    if (const unsigned char* p = raw_bytes(f, model_map_, ds, bytes)) {
      got = detail::crc32c_parallel(p, bytes, io_threads_);
    } else {
      if (scratch_.bytes() < bytes) scratch_ = HostBuffer(bytes);
      f.read(ds, scratch_.data(), di.dtype, di.numel());
      got = crc32c(scratch_.data(), bytes);
    }
    std::uint32_t want = expected_crc(kModelFile, ds);
    DS_CHECK(want == got, "checksum mismatch in " << f.path() << " dataset '" << ds << "' (manifest crc32c:" << hex32(want)
                                                  << ", data crc32c:" << hex32(got) << "): the file is corrupt");
  }
}

void CheckpointReader::verify_flat_range(std::size_t offset, std::size_t count) {
  if (count == 0) return;
  std::vector<bool> need(files_.size(), false);
  for (std::size_t i = 0; i < manifest_.partitions.size(); ++i) {
    const auto& p = manifest_.partitions[i];
    if (p.offset < offset + count && offset < p.offset + p.count) need[part_file_[i]] = true;
  }
  for (std::size_t fi = 0; fi < files_.size(); ++fi)
    if (need[fi]) verify_shard_file(fi, manifest_.shard_datasets);
}

void CheckpointReader::verify_shard_file(std::size_t fi, const std::vector<std::string>& datasets) {
  constexpr std::size_t kChunk = std::size_t(4) << 20;  // floats per read (16 MiB)
  const std::size_t n_el = file_numel_[fi];
  for (const auto& ds : datasets) {
    if (verified_.count({fi, ds})) continue;
    H5File& f = shard_file(fi);
    DatasetInfo di = f.info(ds);
    DS_CHECK(di.dtype == DType::F32 && di.numel() == n_el,
             f.path() << " dataset '" << ds << "' has " << di.numel() << " " << dtype_name(di.dtype)
                      << " elements; the manifest says " << n_el << " fp32");
    std::uint32_t crc = 0;
    if (const unsigned char* raw = raw_bytes(f, shard_maps_[fi], ds, n_el * sizeof(float))) {
      crc = detail::crc32c_parallel(raw, n_el * sizeof(float), io_threads_);
    } else {
      if (scratch_.bytes() < kChunk * sizeof(float)) scratch_ = HostBuffer(kChunk * sizeof(float));
      for (std::size_t o = 0; o < n_el; o += kChunk) {
        std::size_t n = std::min(kChunk, n_el - o);
        f.read_range(ds, scratch_.data(), DType::F32, o, n);
        crc = crc32c(scratch_.data(), n * sizeof(float), crc);
      }
    }
    std::uint32_t want = expected_crc(files_[fi], ds);
    DS_CHECK(want == crc, "checksum mismatch in " << f.path() << " dataset '" << ds << "' (manifest crc32c:" << hex32(want)
                                                  << ", data crc32c:" << hex32(crc) << "): the file is corrupt");
    verified_.insert({fi, ds});
  }
}

void CheckpointReader::read_param(const std::string& name, void* dst, DType dst_dtype, std::size_t numel) {
  if (manifest_.params_in_master) {
    // The working weights are the fp32 master rounded to the working dtype; so is this.
    const ManifestParam& mp = manifest_param(name);
    DS_CHECK(mp.numel == numel, dir_ << "/" << kManifestFile << ": parameter '" << name << "' has " << mp.numel
                                     << " elements, the model " << numel);
    if (dst_dtype == DType::F32) {
      read_flat("fp32_master", mp.flat_offset, numel, static_cast<float*>(dst));
      return;
    }
    if (scratch_.bytes() < numel * sizeof(float)) scratch_ = HostBuffer(numel * sizeof(float));
    float* tmp = scratch_.as<float>();
    read_flat("fp32_master", mp.flat_offset, numel, tmp);
    auto* d = static_cast<unsigned char*>(dst);
    const std::size_t dsz = dtype_size(dst_dtype);
    detail::parallel_ranges(numel, [&](std::size_t lo, std::size_t hi) {
      convert(tmp + lo, DType::F32, d + lo * dsz, dst_dtype, hi - lo);
    }, io_threads_);
    return;
  }
  H5File& f = model_file();
  std::string ds = "params/" + name;
  DatasetInfo di = f.info(ds);
  DS_CHECK(di.numel() == numel, f.path() << " dataset '" << ds << "' has " << di.numel() << " elements, the model " << numel);
  if (const unsigned char* p = raw_bytes(f, model_map_, ds, numel * dtype_size(di.dtype))) {
    if (di.dtype == dst_dtype) {
      detail::copy_parallel(dst, p, numel * dtype_size(dst_dtype), io_threads_);
    } else {
      auto* d = static_cast<unsigned char*>(dst);
      const std::size_t ssz = dtype_size(di.dtype), dsz = dtype_size(dst_dtype);
      detail::parallel_ranges(numel, [&](std::size_t lo, std::size_t hi) {  // element ranges
        convert(p + lo * ssz, di.dtype, d + lo * dsz, dst_dtype, hi - lo);
      }, io_threads_);
    }
    return;
  }
  if (di.dtype == dst_dtype) {
    f.read(ds, dst, dst_dtype, numel);
    return;
  }
  std::size_t bytes = numel * dtype_size(di.dtype);
  if (scratch_.bytes() < bytes) scratch_ = HostBuffer(bytes);
  f.read(ds, scratch_.data(), di.dtype, numel);
  convert(scratch_.data(), di.dtype, dst, dst_dtype, numel);
}

void CheckpointReader::read_param_range(const std::string& name, std::size_t first, std::size_t count, void* dst,
                                        DType dst_dtype) {
  const ManifestParam& mp = manifest_param(name);
  DS_CHECK(first + count <= mp.numel, dir_ << "/" << kManifestFile << ": elements [" << first << ", " << first + count
                                           << ") of parameter '" << name << "', which has " << mp.numel);
  if (count == 0) return;
  auto* d = static_cast<unsigned char*>(dst);
  const std::size_t dsz = dtype_size(dst_dtype);
  if (manifest_.params_in_master) {
    if (dst_dtype == DType::F32) return read_flat("fp32_master", mp.flat_offset + first, count, static_cast<float*>(dst));
    if (scratch_.bytes() < count * sizeof(float)) scratch_ = HostBuffer(count * sizeof(float));
    read_flat("fp32_master", mp.flat_offset + first, count, scratch_.as<float>());
    convert(scratch_.data(), DType::F32, d, dst_dtype, count);
    return;
  }
  H5File& f = model_file();
  const std::string ds = "params/" + name;
  const DatasetInfo di = f.info(ds);
  DS_CHECK(di.numel() == mp.numel, f.path() << " dataset '" << ds << "' has " << di.numel() << " elements, the manifest "
                                            << mp.numel);
  const std::size_t ssz = dtype_size(di.dtype);
  if (const unsigned char* p = raw_bytes(f, model_map_, ds, mp.numel * ssz)) {
    convert(p + first * ssz, di.dtype, d, dst_dtype, count);  // a copy when the dtypes agree
    return;
  }
  HostBuffer whole(mp.numel * dsz);  // not contiguous in the file: through HDF5, whole
  read_param(name, whole.data(), dst_dtype, mp.numel);
  std::memcpy(d, static_cast<const unsigned char*>(whole.data()) + first * dsz, count * dsz);
}

bool CheckpointReader::has_shard_dataset(const std::string& dataset) const {
  return std::find(manifest_.shard_datasets.begin(), manifest_.shard_datasets.end(), dataset) != manifest_.shard_datasets.end();
}

void CheckpointReader::read_flat(const std::string& dataset, std::size_t offset, std::size_t count, float* dst) {
  DS_CHECK(has_shard_dataset(dataset), "checkpoint " << dir_ << " has no partitioned dataset '" << dataset << "'");
  std::vector<std::pair<std::size_t, std::size_t>> covered;
  for (std::size_t i = 0; i < manifest_.partitions.size(); ++i) {
    const auto& p = manifest_.partitions[i];
    std::size_t lo = std::max(offset, p.offset), hi = std::min(offset + count, p.offset + p.count);
    if (lo >= hi) continue;
    const std::size_t fi = part_file_[i], n_el = file_numel_[fi];
    H5File& f = shard_file(fi);
    DatasetInfo di = f.info(dataset);
    DS_CHECK(di.dtype == DType::F32 && di.numel() == n_el,
             f.path() << " dataset '" << dataset << "' has " << di.numel() << " " << dtype_name(di.dtype)
                      << " elements; the manifest says " << n_el << " fp32");
    const std::size_t at = p.position + (lo - p.offset);  // element inside the file's dataset
    if (const unsigned char* raw = raw_bytes(f, shard_maps_[fi], dataset, n_el * sizeof(float)))
      detail::copy_parallel(dst + (lo - offset), raw + at * sizeof(float), (hi - lo) * sizeof(float), io_threads_);
    else
      f.read_range(dataset, dst + (lo - offset), DType::F32, at, hi - lo);
    covered.emplace_back(lo, hi);
  }
  std::sort(covered.begin(), covered.end());
  std::size_t pos = offset;
  for (auto [lo, hi] : covered) {
    if (lo > pos) std::fill(dst + (pos - offset), dst + (lo - offset), 0.0f);
    pos = std::max(pos, hi);
  }
  if (pos < offset + count) std::fill(dst + (pos - offset), dst + count, 0.0f);
}

StateValue CheckpointReader::engine_state() { return model_file().read_state("engine"); }
StateValue CheckpointReader::client_state() { return model_file().read_state("client_state"); }
std::string CheckpointReader::config_json() { return model_file().attr_string("/", "config"); }

}  // namespace ds::io
