// TensorBoard event files (ds/io/tfevents.h): TFRecord framing and the few protobuf fields of
// tensorflow.Event / Summary that scalars need, encoded by hand.
#include "ds/io/tfevents.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "ds/core/error.h"
#include "ds/io/checksum.h"

namespace ds::io {

namespace {

// --- protobuf wire format: the three field kinds an Event needs ---
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out += char((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += char(v);
}
void put_tag(std::string& out, int field, int wire_type) { put_varint(out, std::uint64_t(field << 3 | wire_type)); }
template <class T>
void put_fixed(std::string& out, int field, T value) {  // double: wire type 1; float: 5
  put_tag(out, field, sizeof(T) == 8 ? 1 : 5);
  char b[sizeof(T)];
  std::memcpy(b, &value, sizeof(T));  // little endian, as protobuf and x86/aarch64 Linux
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event {1: wall_time double, 2: step int64, 3: file_version string, 5: summary Summary}
std::string version_event() {
  std::string e;
  put_fixed(e, 1, wall_time());
  put_bytes(e, 3, "brain.Event:2");
  return e;
}
std::string scalar_event(double time, std::int64_t step, const std::string& tag, float value) {
  std::string v;  // Summary.Value {1: tag string, 2: simple_value float}
  put_bytes(v, 1, tag);
  put_fixed(v, 2, value);
  std::string summary;  // Summary {1: repeated Value}
  put_bytes(summary, 1, v);
  std::string e;
  put_fixed(e, 1, time);
  put_tag(e, 2, 0);
  put_varint(e, std::uint64_t(step));
  put_bytes(e, 5, summary);
  return e;
}

std::string hostname() {
  char h[256] = {};
  if (gethostname(h, sizeof h - 1) != 0) return "localhost";
  return h;
}

// A new file in dir, never one that exists (two writers in one second get different names).
std::FILE* open_new(const std::string& dir, std::string& path) {
  const std::string base =
      dir + "/events.out.tfevents." + std::to_string(std::int64_t(wall_time())) + "." + hostname();
  for (int attempt = 0; attempt < 100; ++attempt) {
    path = attempt == 0 ? base : base + "." + std::to_string(getpid()) + "." + std::to_string(attempt);
    if (std::FILE* f = std::fopen(path.c_str(), "wbx")) return f;
    if (errno != EEXIST) break;
  }
  DS_THROW("tensorboard: cannot create an event file in " << dir << ": " << std::strerror(errno));
}

}  // namespace

std::uint32_t masked_crc32c(const void* data, std::size_t bytes) {
  const std::uint32_t c = crc32c(data, bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string tfrecord_frame(const std::string& data) {
  std::string out;
  const std::uint64_t len = data.size();
  char b[8];
  std::memcpy(b, &len, 8);
  out.append(b, 8);
  const std::uint32_t len_crc = masked_crc32c(b, 8);
  std::memcpy(b, &len_crc, 4);
  out.append(b, 4);
  out += data;
  const std::uint32_t data_crc = masked_crc32c(data.data(), data.size());
  std::memcpy(b, &data_crc, 4);
  out.append(b, 4);
  return out;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DS_CHECK(!ec, "tensorboard: cannot create the directory " << dir << ": " << ec.message());
  f_ = open_new(dir, path_);
  write_record(version_event());
}

EventWriter::~EventWriter() {
  if (f_) std::fclose(f_);
}

void EventWriter::add_scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& scalars) {
  const double time = wall_time();
  for (const auto& [tag, value] : scalars) write_record(scalar_event(time, step, tag, value));
  DS_CHECK(std::fflush(f_) == 0, "tensorboard: writing " << path_ << " failed: " << std::strerror(errno));
}

void EventWriter::write_record(const std::string& data) {
  const std::string frame = tfrecord_frame(data);
  DS_CHECK(std::fwrite(frame.data(), 1, frame.size(), f_) == frame.size(),
           "tensorboard: writing " << path_ << " failed: " << std::strerror(errno));
}

}  // namespace ds::io
