// Bulk byte movement for checkpoint datasets, beside HDF5 (private to ds_io).
//
// HDF5 lays out the files (create_raw / raw_extent give each contiguous dataset's byte range);
// the elements themselves move here:
//   - save: write_raw() splits every dataset into chunks written by io_threads(n) threads with
//     pwrite, computes each chunk's CRC-32C just before writing it (the chunk is then in
//     cache for the copy into the page cache) and starts the chunk's writeback at once
//     (sync_file_range), so the disk writes while the threads fill the page cache and the
//     final fsync has little left to do;
//   - load: MappedFile maps a checkpoint file read-only; crc32c_parallel and copy_parallel
//     checksum and copy its ranges on io_threads(n) threads, with no intermediate buffer (the
//     CRC pass of a verified load reads the page cache in place).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ds::io::detail {

// Threads for bulk I/O: `requested` when > 0 (SaveOptions / LoadOptions::io_threads, from the
// config's checkpoint.io_threads), else automatic: the hardware threads, at most 4.
int io_threads(int requested);

// Runs fn(begin, end) on [0, bytes) split into io_threads(threads) contiguous parts (64-byte
// aligned cuts; one part when bytes is small). Exceptions from any part are rethrown.
void parallel_ranges(std::size_t bytes, const std::function<void(std::size_t, std::size_t)>& fn, int threads);

std::uint32_t crc32c_parallel(const void* data, std::size_t bytes, int threads);
void copy_parallel(void* dst, const void* src, std::size_t bytes, int threads);

struct RawWrite {
  int fd = -1;
  std::uint64_t offset = 0;   // file offset
  const void* src = nullptr;
  std::size_t bytes = 0;
  std::string what;           // "<file> dataset <name>" for errors
};
// Writes every job (see above) and returns each job's CRC-32C. after_chunk(job) runs on the
// writing thread after each chunk (a test hook). ds::Error naming the job on a failed write.
std::vector<std::uint32_t> write_raw(const std::vector<RawWrite>& jobs, const std::function<void(std::size_t)>& after_chunk,
                                     int threads);

// A whole file mapped read-only (MAP_SHARED): the page cache itself, no copy.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // ds::Error naming the path on failure
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return static_cast<const unsigned char*>(addr_); }
  std::uint64_t size() const { return size_; }
  // The mapped bytes [offset, offset + bytes); ds::Error naming `what` when the range lies
  // beyond the end of the file (a truncated file).
  const unsigned char* range(std::uint64_t offset, std::uint64_t bytes, const std::string& what) const;

 private:
  std::string path_;
  void* addr_ = nullptr;
  std::uint64_t size_ = 0;
};

}  // namespace ds::io::detail
