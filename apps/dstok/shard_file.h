// llm.c's token shard layout (as its fineweb.py writes and train_gpt2.c reads): a header of
// 256 little-endian int32 -- [0] magic 20240520, [1] version, [2] token count, the rest 0 --
// then the tokens: version 1 uint16 (vocabularies up to 65536 ids), version 2 uint32 (larger
// ones, this project's extension).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ds::tools {

inline constexpr std::int32_t kShardMagic = 20240520;
inline constexpr std::size_t kShardHeaderInts = 256;

// The version that holds every id below vocab_size: 1 (uint16) or 2 (uint32).
int shard_version_for(std::int64_t vocab_size);

// Writes one shard; throws ds::Error naming `path` on failure.
void write_shard(const std::string& path, std::span<const std::int32_t> tokens, int version);

// Reads one shard, checking the magic, version and that the size matches the count; errors
// name `what` (the flag) and `path`.
std::vector<std::int32_t> read_shard(const std::string& path, const std::string& what);

}  // namespace ds::tools
