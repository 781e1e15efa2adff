// A small HDF5 file wrapper for checkpoints (HDF5 stays a private dependency of ds_io).
//
// Every HDF5 call goes through DS_H5_CHECK (io/src/h5_check.h): a failure throws ds::Error
// naming the call, the file being accessed, the source line and the rank, with HDF5's own
// error stack condensed into one readable line (HDF5 does not print it to stderr).
//
// Element types on disk (all little-endian, h5py reads each natively):
//   F32 -> IEEE f32   F64 -> IEEE f64   I64 -> int64   I32 -> int32   U8 -> uint8
//   F16 -> IEEE binary16 (numpy float16)
//   BF16 -> uint16 holding the bf16 bits, with the attribute dtype = "bf16" on the dataset
//           (numpy has no bfloat16: `(a.astype(np.uint32) << 16).view(np.float32)`)
// Datasets are contiguous (no chunking, no filters), so reads and writes move raw bytes.
// Files are created with objects of 64 KiB or more aligned to 4 KiB in the file (page
// aligned: mmap, O_DIRECT and the page cache see whole pages of one dataset).
//
// Thread safety: Debian's serial HDF5 is built thread-safe; one H5File is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/core/dtype.h"
#include "ds/io/state_value.h"

namespace ds::io {

// Where a contiguous dataset's elements lie in the file: bytes [offset, offset + bytes).
struct RawExtent {
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

struct DatasetInfo {
  DType dtype = DType::F32;
  std::vector<std::int64_t> shape;  // empty: scalar
  std::size_t numel() const;
};

class H5File {
 public:
  enum class Mode { Create, Read };
  // Create: a new file (an existing one is truncated). Read: read-only.
  H5File(const std::string& path, Mode mode);
  ~H5File();  // closes quietly; call close() to see errors
  H5File(H5File&& o) noexcept;
  H5File& operator=(H5File&&) = delete;
  H5File(const H5File&) = delete;

  const std::string& path() const { return path_; }

  // Datasets. `name` may contain '/', intermediate groups are created.
  void write(std::string_view name, const void* data, DType dtype, std::span<const std::int64_t> shape);
  void write_1d(std::string_view name, const void* data, DType dtype, std::size_t count) {
    std::int64_t n = std::int64_t(count);
    write(name, data, dtype, std::span<const std::int64_t>(&n, 1));
  }
  // Creates a contiguous dataset whose storage is allocated now and never filled by HDF5
  // (alloc time early, fill time never) and returns its extent in the file, so the caller
  // writes the elements itself (after close(), through its own descriptor: the bulk-write
  // path of checkpoints). std::nullopt for an empty dataset (no storage).
  std::optional<RawExtent> create_raw(std::string_view name, DType dtype, std::span<const std::int64_t> shape);
  // The extent of a dataset that is contiguous, allocated and stored inside this file (no
  // external storage, no filters): its bytes can be read straight from the file. std::nullopt
  // otherwise (e.g. a chunked dataset written by another tool).
  std::optional<RawExtent> raw_extent(std::string_view name) const;
  bool exists(std::string_view name) const;  // dataset or group
  DatasetInfo info(std::string_view name) const;
  // Reads the whole dataset into dst (count elements of `dtype`, which must equal the stored
  // element type and element count; otherwise ds::Error naming file and dataset).
  void read(std::string_view name, void* dst, DType dtype, std::size_t count) const;
  // Reads elements [offset, offset + count) of the flattened dataset (a hyperslab of a 1-D
  // dataset) into dst.
  void read_range(std::string_view name, void* dst, DType dtype, std::size_t offset, std::size_t count) const;

  // Attributes on a dataset or group ("/" for the file root).
  void set_attr(std::string_view obj, std::string_view attr, std::string_view value);
  void set_attr(std::string_view obj, std::string_view attr, std::int64_t value);
  bool has_attr(std::string_view obj, std::string_view attr) const;
  std::string attr_string(std::string_view obj, std::string_view attr) const;
  std::int64_t attr_int(std::string_view obj, std::string_view attr) const;

  // Children names of a group, sorted by name.
  std::vector<std::string> list(std::string_view group) const;

  // The StateValue tree under group `name` (see docs/user/checkpoints.md "State trees").
  void write_state(std::string_view name, const StateValue& value);
  StateValue read_state(std::string_view name) const;

  // Flushes, closes, and (Create mode, when sync) fsyncs the file. Errors throw.
  void close(bool sync = true);

 private:
  std::int64_t id_ = -1;  // hid_t
  std::string path_;
  Mode mode_;
};

// fsync a file or directory by path (ds::Error naming it on failure).
void fsync_path(const std::string& path);

}  // namespace ds::io
