#include "data_source.h"

#include <cstdio>
#include <filesystem>
#include <string_view>

#include "ds/core/error.h"
#include "ds/core/file_read.h"

namespace ds::train {

namespace {
// HDF5's format signature, at the file's start (files with a user block are not recognised).
constexpr std::string_view kHdf5Signature("\x89HDF\r\n\x1a\n", 8);
}  // namespace

DataSource open_data(const TrainOptions& opts) {
  const std::string& path = opts.data;
  DataSource src;
  const int raw_width = opts.data_dtype == "uint32" ? 4 : 2;
  if (path.empty()) {
    src.text = data::TextDataset::embedded();
    return src;
  }
  if (path.find_first_of("*?[") != std::string::npos) {
    src.shards = data::TokenShards::open(path, raw_width);
    return src;
  }
  DS_CHECK(std::filesystem::exists(path), "--data " << path << ": no such file");
  check_regular_file(path, "--data");  // a FIFO would block the fopen below; /dev/zero never ends
  char magic[8] = {};
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) DS_THROW("--data " << path << ": cannot open for reading");
  const std::size_t got = std::fread(magic, 1, sizeof magic, f);
  std::fclose(f);
  const std::string_view head(magic, got);
  if (head == kHdf5Signature) {
    src.arrays = data::Hdf5Dataset::open(path, opts.data_inputs, opts.data_targets);
    return src;
  }
  const TrainOptions defaults;
  DS_CHECK(opts.data_inputs == defaults.data_inputs && opts.data_targets == defaults.data_targets,
           "--data_inputs and --data_targets name arrays of an HDF5 file; --data " << path << " is not one");
  const bool bin = std::filesystem::path(path).extension() == ".bin";
  if (head == "DSTOKENS")
    src.text = data::TextDataset::from_token_file(path);
  else if (bin || !opts.data_dtype.empty() || data::TokenShards::has_llmc_magic(path))
    src.shards = data::TokenShards::open(path, raw_width);
  else
    src.text = data::TextDataset::from_file(path);
  return src;
}

std::string describe_shards(const data::TokenShards& shards) {
  const auto& ps = shards.pieces();
  return std::to_string(ps.size()) + (ps[0].header_bytes > 0 ? " llm.c shard" : " raw token file") +
         (ps.size() > 1 ? "s" : "") + ", " + (ps[0].width == 2 ? "uint16" : "uint32") + " tokens, memory-mapped";
}

}  // namespace ds::train
