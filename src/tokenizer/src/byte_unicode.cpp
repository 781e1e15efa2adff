#include "byte_unicode.h"

#include <array>

#include "unicode_class.h"

namespace ds::tokenizer::detail {

namespace {

struct Tables {
  std::array<char32_t, 256> to_char{};
  std::array<int, 324> to_byte{};  // indexed by code point; every mapped one is below 324

  Tables() {
    to_byte.fill(-1);
    // Printable Latin-1 bytes stand for themselves; the other 68 get 256, 257, ... in order.
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      const char32_t c = printable ? char32_t(b) : char32_t(next++);
      to_char[std::size_t(b)] = c;
      to_byte[std::size_t(c)] = b;
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

char32_t byte_to_char(unsigned char b) { return tables().to_char[b]; }

std::optional<std::string> spelling_to_bytes(std::string_view spelling) {
  const Tables& t = tables();
  std::string out;
  out.reserve(spelling.size());
  for (std::size_t i = 0; i < spelling.size();) {
    const Utf8Char c = next_char(spelling, i);
    if (c.cp == kInvalidChar || c.cp >= t.to_byte.size() || t.to_byte[c.cp] < 0) return std::nullopt;
    out.push_back(char(t.to_byte[c.cp]));
    i += c.len;
  }
  return out;
}

std::string bytes_to_spelling(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, byte_to_char(b));
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

}  // namespace ds::tokenizer::detail
