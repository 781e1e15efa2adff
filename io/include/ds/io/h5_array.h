// Reading N-D array datasets of an HDF5 file a user gives as training data (any HDF5 file:
// h5py, NumPy via h5py, other tools), row by row: a row is one index of the first axis (one
// sample). HDF5 converts the stored element type to the one asked for (integers to float,
// float64 to float32, ...), so any integer or floating-point layout reads the same.
//
// Every HDF5 call goes through DS_H5_CHECK (io/src/h5_check.h): a failure throws ds::Error
// naming the call, the file and the dataset. One H5ArrayFile is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::io {

// What a dataset's elements are: numbers this reader converts, or anything else (strings,
// compound records, enums, references, ...), which it refuses.
enum class ElementKind { Float, Integer, Other };

struct ArrayInfo {
  ElementKind kind = ElementKind::Other;
  std::string type_name;            // NumPy's name: "float32", "int64", "uint8"; else "string", "compound", ...
  std::vector<std::int64_t> shape;  // empty: a scalar dataset
};

class H5ArrayFile {
 public:
  // Opens `path` read-only; ds::Error naming it when it is missing, not a regular file or
  // not HDF5.
  explicit H5ArrayFile(const std::string& path);
  ~H5ArrayFile();
  H5ArrayFile(H5ArrayFile&& o) noexcept;
  H5ArrayFile& operator=(H5ArrayFile&&) = delete;
  H5ArrayFile(const H5ArrayFile&) = delete;

  const std::string& path() const { return path_; }
  // Whether `name` ("inputs", "group/x") is a dataset (false for a group or nothing).
  bool is_dataset(std::string_view name) const;
  ArrayInfo info(std::string_view name) const;

  // Rows `rows` (any order, repeats allowed) of dataset `name` (rank >= 1), each row_numel
  // elements (the product of the shape after the first axis), into dst one after the other,
  // converted to float32 or to int32 (integers out of int32's range saturate).
  void read_rows(std::string_view name, std::span<const std::size_t> rows, float* dst) const;
  void read_rows(std::string_view name, std::span<const std::size_t> rows, std::int32_t* dst) const;
  // Rows [first, first + count) as int32, in one read.
  void read_row_range(std::string_view name, std::size_t first, std::size_t count, std::int32_t* dst) const;

 private:
  std::int64_t id_ = -1;  // hid_t of the file
  std::string path_;
};

}  // namespace ds::io
