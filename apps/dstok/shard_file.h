// llm.c's token shard layout, as dstok encode writes it (the reader is ds::data::TokenShards,
// which also reads llm.c's Llama 3 shards): a header of 256 little-endian int32 -- [0] magic
// 20240520, [1] version, [2] token count, the rest 0 -- then the tokens: version 1 uint16
// (vocabularies up to 65536 ids), version 2 uint32 (larger ones, this project's extension).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace ds::tools {

// The version that holds every id below vocab_size: 1 (uint16) or 2 (uint32).
int shard_version_for(std::int64_t vocab_size);

// The size of a shard of `tokens` tokens in `version`'s layout.
std::uint64_t shard_file_bytes(std::uint64_t tokens, int version);

// Writes one shard to the open file `fd`; throws ds::Error naming `path` on failure (a full
// disk: "No space left on device").
void write_shard(int fd, const std::string& path, std::span<const std::int32_t> tokens, int version);

}  // namespace ds::tools
