#include "data_source.h"

#include <cstdio>
#include <filesystem>
#include <string_view>

#include "ds/core/error.h"
#include "ds/core/file_read.h"

namespace ds::train {

DataSource open_data(const std::string& path, const std::string& data_dtype) {
  DataSource src;
  const int raw_width = data_dtype == "uint32" ? 4 : 2;
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
  const bool dstokens = got == 8 && std::string_view(magic, 8) == "DSTOKENS";
  const bool bin = std::filesystem::path(path).extension() == ".bin";
  if (dstokens)
    src.text = data::TextDataset::from_token_file(path);
  else if (bin || !data_dtype.empty() || data::TokenShards::has_llmc_magic(path))
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
