// GPT-2's reversible map between bytes and printable Unicode characters (bytes_to_unicode in
// GPT-2's encoder.py): vocab.json and merges.txt spell every token as the characters of its
// bytes, so that spaces and control bytes are visible ("Ġ" is the byte 0x20).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace ds::tokenizer::detail {

// The character (code point) that stands for byte b.
char32_t byte_to_char(unsigned char b);
// A token's vocabulary spelling -> its bytes; nullopt when a character is not one of the 256.
std::optional<std::string> spelling_to_bytes(std::string_view spelling);
// Bytes -> the vocabulary spelling (UTF-8).
std::string bytes_to_spelling(std::string_view bytes);
// Appends code point cp as UTF-8.
void append_utf8(std::string& out, char32_t cp);

}  // namespace ds::tokenizer::detail
