#include "shard_file.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>

#include "ds/core/error.h"
#include "ds/core/file_read.h"

namespace ds::tools {

int shard_version_for(std::int64_t vocab_size) { return vocab_size > 65536 ? 2 : 1; }

void write_shard(const std::string& path, std::span<const std::int32_t> tokens, int version) {
  DS_CHECK(tokens.size() <= std::size_t(std::numeric_limits<std::int32_t>::max()),
           path << ": " << tokens.size() << " tokens do not fit one shard's int32 count");
  std::int32_t header[kShardHeaderInts] = {};
  header[0] = kShardMagic;
  header[1] = version;
  header[2] = std::int32_t(tokens.size());
  std::vector<unsigned char> body(tokens.size() * (version == 1 ? 2 : 4));
  if (version == 1) {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto v = std::uint16_t(tokens[i]);
      std::memcpy(&body[2 * i], &v, 2);
    }
  } else {
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const auto v = std::uint32_t(tokens[i]);
      std::memcpy(&body[4 * i], &v, 4);
    }
  }
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(path.c_str(), "wb"), &std::fclose);
  DS_CHECK(f, "cannot create " << path << ": " << std::strerror(errno));
  const bool ok = std::fwrite(header, sizeof header, 1, f.get()) == 1 &&
                  (body.empty() || std::fwrite(body.data(), body.size(), 1, f.get()) == 1);
  DS_CHECK(ok && std::fclose(f.release()) == 0, "writing " << path << " failed: " << std::strerror(errno));
}

std::vector<std::int32_t> read_shard(const std::string& path, const std::string& what) {
  const std::string data = read_regular_file(path, what, std::numeric_limits<std::uint64_t>::max());
  const std::size_t header_bytes = kShardHeaderInts * sizeof(std::int32_t);
  DS_CHECK(data.size() >= header_bytes, what << " " << path << " is not an llm.c token shard: " << data.size()
                                             << " bytes, less than the 1024-byte header");
  std::int32_t header[kShardHeaderInts];
  std::memcpy(header, data.data(), header_bytes);
  DS_CHECK(header[0] == kShardMagic, what << " " << path << " is not an llm.c token shard: magic " << header[0]
                                          << ", expected " << kShardMagic);
  DS_CHECK(header[1] == 1 || header[1] == 2, what << " " << path << ": shard version " << header[1]
                                                  << " is not supported (1: uint16 tokens, 2: uint32 tokens)");
  const std::size_t width = header[1] == 1 ? 2 : 4;
  DS_CHECK(header[2] >= 0 && data.size() - header_bytes == std::size_t(header[2]) * width,
           what << " " << path << ": the header says " << header[2] << " tokens (" << std::int64_t(header[2]) * std::int64_t(width)
                << " bytes) but the file has " << data.size() - header_bytes << " bytes after the header");
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(header[2]));
  const char* p = data.data() + header_bytes;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (width == 2) {
      std::uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      tokens[i] = v;
    } else {
      std::uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      DS_CHECK(v <= std::uint32_t(std::numeric_limits<std::int32_t>::max()),
               what << " " << path << ": token " << v << " at position " << i << " is out of range");
      tokens[i] = std::int32_t(v);
    }
  }
  return tokens;
}

}  // namespace ds::tools
