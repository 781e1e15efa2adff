// --data: which reader takes the file, by its name and first bytes.
#pragma once

#include <optional>
#include <string>

#include "ds/data/dataset.h"
#include "ds/data/token_shards.h"

namespace ds::train {

// Exactly one of the two is filled: text or DSTOKENS data in `text`, nanoGPT / llm.c token
// files (memory-mapped) in `shards`.
struct DataSource {
  data::TextDataset text;
  std::optional<data::TokenShards> shards;
};

// The embedded corpus (empty path), a text file, a DSTOKENS file (by magic), or nanoGPT /
// llm.c token files: a glob, an llm.c shard (by magic), a .bin file, or any file when
// `data_dtype` (uint16 | uint32) is given. Throws ds::Error naming --data.
DataSource open_data(const std::string& path, const std::string& data_dtype);

// "3 llm.c shards, uint16 tokens, memory-mapped" for the log.
std::string describe_shards(const data::TokenShards& shards);

}  // namespace ds::train
