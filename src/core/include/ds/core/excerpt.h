// Quoting input in an error message without echoing all of it: a value read from a file can
// be megabytes long (a hostile safetensors header, a corrupt vocabulary), and an error must
// stay one readable line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace ds {

inline constexpr std::size_t kExcerptBytes = 80;

// `text` when it has at most `max_bytes` bytes; otherwise its first `max_bytes` bytes (cut
// before a UTF-8 continuation byte, so no character is split) + "... (N bytes)".
inline std::string excerpt(std::string_view text, std::size_t max_bytes = kExcerptBytes) {
  if (text.size() <= max_bytes) return std::string(text);
  std::size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "... (" + std::to_string(text.size()) + " bytes)";
}

}  // namespace ds
