// Writers for the token files the data tests read: nanoGPT's raw .bin and llm.c's shards.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

// llm.c's layout: 256 x int32 header (magic, version, token count), then the tokens (uint16
// for version 1, uint32 otherwise). `count` overrides the header's token count.
inline void write_llmc_shard(const std::string& path, const std::vector<std::uint32_t>& tokens, int version = 1,
                             std::int64_t count = -1, std::int32_t magic = 20240520) {
  std::vector<std::int32_t> h(256, 0);
  h[0] = magic;
  h[1] = version;
  h[2] = std::int32_t(count < 0 ? std::int64_t(tokens.size()) : count);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(h.data()), 1024);
  for (std::uint32_t t : tokens) {
    if (version != 1) {
      f.write(reinterpret_cast<const char*>(&t), 4);
    } else {
      const auto s = std::uint16_t(t);
      f.write(reinterpret_cast<const char*>(&s), 2);
    }
  }
}

// nanoGPT's layout: the tokens and nothing else (width 2: uint16, 4: uint32).
inline void write_raw_tokens(const std::string& path, const std::vector<std::uint32_t>& tokens, int width = 2) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  for (std::uint32_t t : tokens) {
    if (width == 4) {
      f.write(reinterpret_cast<const char*>(&t), 4);
    } else {
      const auto s = std::uint16_t(t);
      f.write(reinterpret_cast<const char*>(&s), 2);
    }
  }
}
