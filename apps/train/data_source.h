// --data: which reader takes the file, by its name and first bytes.
#pragma once

#include <optional>
#include <string>

#include "ds/data/dataset.h"
#include "ds/data/hdf5_dataset.h"
#include "ds/data/token_shards.h"
#include "options.h"

namespace ds::train {

// Exactly one of the three is filled: text or DSTOKENS data in `text`, nanoGPT / llm.c token
// files (memory-mapped) in `shards`, an HDF5 file's input and target arrays in `arrays`.
struct DataSource {
  data::TextDataset text;
  std::optional<data::TokenShards> shards;
  std::optional<data::Hdf5Dataset> arrays;
};

// The embedded corpus (empty path), a text file, a DSTOKENS file (by magic), an HDF5 file (by
// its signature: the arrays --data_inputs and --data_targets), or nanoGPT / llm.c token files:
// a glob, an llm.c shard (by magic), a .bin file, or any file when `data_dtype` (uint16 |
// uint32) is given. Throws ds::Error naming --data.
DataSource open_data(const TrainOptions& opts);

// "3 llm.c shards, uint16 tokens, memory-mapped" for the log.
std::string describe_shards(const data::TokenShards& shards);

}  // namespace ds::train
