// safetensors writing, streamed: the header goes out first (every tensor's range is known from
// the specs), then the tensors' data in the same order.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/io/safetensors.h"

namespace ds::io {

namespace {

const char* format_dtype(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    default: return nullptr;
  }
}

std::size_t numel_of(const std::vector<std::int64_t>& shape) {
  std::size_t n = 1;
  for (auto d : shape) n *= std::size_t(d);
  return n;
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<SafetensorsSpec> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), specs_(std::move(tensors)) {
  // Written by hand rather than by nlohmann's dump, which sorts keys: the tensors appear in
  // data order, "__metadata__" first, as the reference writer lays them out.
  std::string h = "{";
  if (!metadata.empty()) h += "\"__metadata__\":" + nlohmann::json(metadata).dump();
  std::uint64_t offset = 0;
  for (const auto& s : specs_) {
    const char* dt = format_dtype(s.dtype);
    DS_CHECK(dt, path << ": tensor '" << s.name << "': safetensors output takes F32, F16 or BF16, not "
                      << dtype_name(s.dtype));
    DS_CHECK(s.name != "__metadata__" && !s.name.empty(), path << ": tensor name '" << s.name << "' is not allowed");
    for (auto d : s.shape) DS_CHECK(d >= 0, path << ": tensor '" << s.name << "' has a negative dimension");
    const std::uint64_t bytes = numel_of(s.shape) * dtype_size(s.dtype);
    if (h.size() > 1) h += ',';
    h += nlohmann::json(s.name).dump() + ":{\"dtype\":\"" + dt + "\",\"shape\":" + nlohmann::json(s.shape).dump() +
         ",\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + bytes) + "]}";
    offset += bytes;
  }
  h += '}';
  while (h.size() % 8) h += ' ';
  f_ = std::fopen(path.c_str(), "wb");
  DS_CHECK(f_, "cannot create " << path << ": " << std::strerror(errno));
  unsigned char len[8];
  const std::uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, f_) != 8 || std::fwrite(h.data(), 1, h.size(), f_) != h.size()) {
    const int err = errno;
    std::fclose(f_);
    f_ = nullptr;
    DS_THROW("writing " << path << " failed: " << std::strerror(err));
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (f_) std::fclose(f_);
}

void SafetensorsWriter::write(std::span<const float> values) {
  DS_CHECK(f_, path_ << ": write after close");
  DS_CHECK(next_ < specs_.size(), path_ << ": all " << specs_.size() << " tensors are written already");
  const SafetensorsSpec& s = specs_[next_];
  DS_CHECK(values.size() == numel_of(s.shape), path_ << ": tensor '" << s.name << "' takes " << numel_of(s.shape)
                                                     << " values, got " << values.size());
  if (s.dtype == DType::F32) {
    DS_CHECK(std::fwrite(values.data(), 1, values.size_bytes(), f_) == values.size_bytes(),
             "writing " << path_ << " failed: " << std::strerror(errno));
  } else {
    constexpr std::size_t kChunk = std::size_t(1) << 20;
    for (std::size_t i = 0; i < values.size(); i += kChunk) {
      const std::size_t n = std::min(kChunk, values.size() - i);
      scratch_.resize(n);
      convert(values.data() + i, DType::F32, scratch_.data(), s.dtype, n);
      DS_CHECK(std::fwrite(scratch_.data(), 2, n, f_) == n, "writing " << path_ << " failed: " << std::strerror(errno));
    }
  }
  ++next_;
}

void SafetensorsWriter::close() {
  DS_CHECK(f_, path_ << ": closed twice");
  DS_CHECK(next_ == specs_.size(), path_ << ": closed after " << next_ << " of " << specs_.size()
                                         << " tensors (next: '" << specs_[next_].name << "')");
  const bool ok = std::fflush(f_) == 0 && ::fsync(::fileno(f_)) == 0;
  const int err = errno;
  const bool closed = std::fclose(f_) == 0;
  f_ = nullptr;
  DS_CHECK(ok && closed, "writing " << path_ << " failed: " << std::strerror(err));
}

}  // namespace ds::io
