#include "ds/core/base64.h"

#include "ds/core/error.h"

namespace ds {
namespace {

constexpr char kUrlSafe[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

int value_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '-' || c == '+') return 62;
  if (c == '_' || c == '/') return 63;
  return -1;
}

// Decodes into `out`; on failure returns false with `bad` the offending character ('\0' for
// a bad length).
bool decode(std::string_view text, std::string& out, char& bad) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  bad = '\0';
  if (text.size() % 4 == 1) return false;
  out.clear();
  out.reserve(text.size() / 4 * 3 + 2);
  unsigned acc = 0;
  int bits = 0;
  for (char c : text) {
    const int v = value_of(c);
    if (v < 0) {
      bad = c;
      return false;
    }
    acc = (acc << 6) | static_cast<unsigned>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return true;
}

}  // namespace

std::string base64_urlsafe_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  auto byte = [&](std::size_t k) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[k])); };
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned v = (byte(i) << 16) | (byte(i + 1) << 8) | byte(i + 2);
    out += kUrlSafe[(v >> 18) & 63];
    out += kUrlSafe[(v >> 12) & 63];
    out += kUrlSafe[(v >> 6) & 63];
    out += kUrlSafe[v & 63];
  }
  const std::size_t rest = bytes.size() - i;
  if (rest == 1) {
    const unsigned v = byte(i) << 16;
    out += kUrlSafe[(v >> 18) & 63];
    out += kUrlSafe[(v >> 12) & 63];
    out += "==";
  } else if (rest == 2) {
    const unsigned v = (byte(i) << 16) | (byte(i + 1) << 8);
    out += kUrlSafe[(v >> 18) & 63];
    out += kUrlSafe[(v >> 12) & 63];
    out += kUrlSafe[(v >> 6) & 63];
    out += '=';
  }
  return out;
}

std::string base64_decode(std::string_view text) {
  std::string out;
  char bad = '\0';
  if (!decode(text, out, bad)) {
    DS_CHECK(bad != '\0', "bad base64 length");
    DS_THROW("bad base64 character '" << bad << "'");
  }
  return out;
}

std::optional<std::string> try_base64_decode(std::string_view text) {
  std::string out;
  char bad = '\0';
  if (!decode(text, out, bad)) return std::nullopt;
  return out;
}

}  // namespace ds
