// UTF-8 decoding and the character classes of GPT-2's pre-tokenizer pattern (\p{L}, \p{N},
// \s). The class tables are an approximation of Unicode's: see unicode_class.cpp for the
// scripts they cover.
#pragma once

#include <cstddef>
#include <string_view>

namespace ds::tokenizer::detail {

// A byte that does not start a valid UTF-8 sequence (bad lead byte, missing continuation,
// overlong form, surrogate, above U+10FFFF) decodes as this, one byte long.
inline constexpr char32_t kInvalidChar = 0xFFFFFFFF;

struct Utf8Char {
  char32_t cp;
  unsigned len;  // bytes, 1..4
};

// The character starting at s[i] (i < s.size()).
Utf8Char next_char(std::string_view s, std::size_t i);

enum class CharClass { Letter, Number, Space, Other };
CharClass classify(char32_t cp);

}  // namespace ds::tokenizer::detail
