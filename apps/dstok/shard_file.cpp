#include "shard_file.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "ds/core/error.h"
#include "ds/data/token_shards.h"

namespace ds::tools {

namespace {

void write_all(int fd, const std::string& path, const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    DS_CHECK(n > 0, "writing " << path << " failed: " << std::strerror(n < 0 ? errno : EIO));
    p += n;
    bytes -= std::size_t(n);
  }
}

// Appends tokens [0, n) as little-endian integers of `width` bytes.
void append_tokens(std::vector<unsigned char>& out, std::span<const std::int32_t> tokens, std::size_t width) {
  const std::size_t at = out.size();
  out.resize(at + tokens.size() * width);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto v = std::uint32_t(tokens[i]);
    for (std::size_t b = 0; b < width; ++b) out[at + i * width + b] = static_cast<unsigned char>(v >> (8 * b));
  }
}

}  // namespace

int shard_version_for(std::int64_t vocab_size) { return vocab_size > 65536 ? 2 : 1; }

std::uint64_t shard_file_bytes(std::uint64_t tokens, int version) {
  return data::kLlmcHeaderBytes + tokens * (version == 1 ? 2 : 4);
}

void write_shard(int fd, const std::string& path, std::span<const std::int32_t> tokens, int version) {
  DS_CHECK(tokens.size() <= std::size_t(std::numeric_limits<std::int32_t>::max()),
           path << ": " << tokens.size() << " tokens do not fit one shard's int32 count");
  std::int32_t header[data::kLlmcHeaderBytes / sizeof(std::int32_t)] = {};
  header[0] = data::kLlmcMagic;
  header[1] = version;
  header[2] = std::int32_t(tokens.size());
  write_all(fd, path, header, sizeof header);
  // A bounded buffer at a time: a shard may hold hundreds of millions of tokens.
  constexpr std::size_t kChunkTokens = std::size_t(1) << 20;
  const std::size_t width = version == 1 ? 2 : 4;
  std::vector<unsigned char> buf;
  for (std::size_t at = 0; at < tokens.size(); at += kChunkTokens) {
    buf.clear();
    append_tokens(buf, tokens.subspan(at, std::min(kChunkTokens, tokens.size() - at)), width);
    write_all(fd, path, buf.data(), buf.size());
  }
}

}  // namespace ds::tools
