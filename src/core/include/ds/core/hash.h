// FNV-1a, 64 bit: the one hash dstrain uses for fingerprints that ranks compare (model
// layouts, job identity, checkpoint tags). Not cryptographic; chain calls by passing the last
// result as `h` to hash several pieces as one stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace ds {

inline constexpr std::uint64_t kFnv1aOffset = 14695981039346656037ull;  // 0xcbf29ce484222325

inline std::uint64_t fnv1a64(const void* data, std::size_t n, std::uint64_t h = kFnv1aOffset) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

inline std::uint64_t fnv1a64(std::string_view s, std::uint64_t h = kFnv1aOffset) {
  return fnv1a64(s.data(), s.size(), h);
}

}  // namespace ds
