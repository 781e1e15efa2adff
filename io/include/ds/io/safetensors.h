// safetensors files (the Hugging Face weight format), read and written without the library.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON
//   {"__metadata__": {str: str} (optional), name: {"dtype": "F32", "shape": [..],
//    "data_offsets": [begin, end]}, ...}
// (padded with spaces to a multiple of 8 by the reference writer), then the data section:
// the tensors' raw little-endian bytes, [begin, end) relative to its start. The reader checks
// what the reference implementation checks: the header fits the file, every entry has a known
// dtype and a byte range of exactly numel * dtype size, and the ranges tile the data section
// (no overlap, no gap, nothing past its end); beyond it, a key repeated in one object (a tensor
// named twice) and nesting deeper than 32 levels are refused. Every error names the file and
// the tensor, quoting file values cut to 80 bytes (ds/core/excerpt.h).
//
// Reading streams (pread) tensor by tensor and converts F16 / BF16 to fp32; other dtypes may
// be present (buffers a model ignores) but cannot be read as floats. A directory is read as
// Hugging Face saves one: model.safetensors.index.json ({"weight_map": {name: file}}) and its
// shards, or a single model.safetensors.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ds/core/dtype.h"

namespace ds::io {

// "[2, 3]", for messages: a shape of very many dimensions is cut (ds::excerpt).
std::string shape_text(std::span<const std::int64_t> shape);

// A tensor as a header describes it.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;                 // as written: "F32", "BF16", "I64", ...
  std::optional<DType> float_dtype;  // F32 / F16 / BF16: readable as fp32; empty otherwise
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;  // byte range in the data section
  std::string file;                  // the file that holds it
  std::size_t numel() const;
};

// One .safetensors file: the header is parsed and checked at construction; data is read on
// demand. Throws ds::Error "<path>: ..." for anything the format does not allow.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }  // in data order
  const SafetensorsTensor* find(std::string_view name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Reads tensor t (one of tensors()) as fp32 into out, which must hold t.numel() floats.
  void read_f32(const SafetensorsTensor& t, std::span<float> out) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;  // name -> position in tensors_
  std::map<std::string, std::string> metadata_;
};

// A .safetensors file, or a directory holding model.safetensors.index.json (and the shards it
// names) or model.safetensors.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();

  const std::string& path() const { return path_; }
  // Every tensor of every shard, sorted by name.
  std::vector<const SafetensorsTensor*> tensors() const;
  const SafetensorsTensor* find(std::string_view name) const;
  // The "__metadata__" of the (first) file.
  const std::map<std::string, std::string>& metadata() const { return files_.front()->metadata(); }
  // Throws "<path>: no tensor <name>" when absent, and when out is not numel() floats.
  void read_f32(std::string_view name, std::span<float> out) const;

 private:
  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<const SafetensorsFile*, const SafetensorsTensor*>, std::less<>> by_name_;
};

// What a writer is told up front: the tensors, in the order their data will follow.
struct SafetensorsSpec {
  std::string name;
  DType dtype = DType::F32;  // F32, F16 or BF16
  std::vector<std::int64_t> shape;
};

// Streams a .safetensors file: the header (with "__metadata__" first, the tensors in the given
// order, padded with spaces to a multiple of 8 as the reference writer does) is written at
// construction, then each tensor's fp32 values by write(), converted to its dtype.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<SafetensorsSpec> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();  // closes the file; one not close()d is incomplete (the caller removes it)
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The next tensor's values (exactly its numel floats).
  void write(std::span<const float> values);
  // Checks every tensor was written, flushes and fsyncs.
  void close();

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
  std::vector<SafetensorsSpec> specs_;
  std::size_t next_ = 0;
  std::vector<std::uint16_t> scratch_;
};

}  // namespace ds::io
