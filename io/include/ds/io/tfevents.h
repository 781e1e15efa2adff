// TensorBoard event files: what DeepSpeed's tensorboard monitor writes through
// torch.utils.tensorboard, written here without Python or protobuf.
//
// Format (a contract TensorBoard reads): a sequence of TFRecords, each
//   uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)
// (little endian; masked crc = ((c >> 15) | (c << 17)) + 0xa282ead8), whose data is one
// serialized tensorflow.Event: the first {wall_time, file_version "brain.Event:2"}, then one per
// scalar {wall_time, step, summary {value {tag, simple_value}}}. File name as SummaryWriter's:
// <dir>/events.out.tfevents.<unix seconds>.<hostname>.
//
// Threading: one writer per file, used by one thread. Each add_scalars() call is flushed to the
// kernel before it returns, so a crash loses at most the scalars of the call in progress.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace ds::io {

class EventWriter {
 public:
  // Creates dir (and its parents) and a new event file in it; throws ds::Error naming the path
  // when it cannot.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event per (tag, value) at this step, stamped with the current wall time; flushed.
  void add_scalars(std::int64_t step, const std::vector<std::pair<std::string, float>>& scalars);
  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// The pieces, for tests: one TFRecord frame around data, and the masked CRC.
std::string tfrecord_frame(const std::string& data);
std::uint32_t masked_crc32c(const void* data, std::size_t bytes);

}  // namespace ds::io
