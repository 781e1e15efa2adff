// GPT-2's pre-tokenizer: splits text (no special tokens in it) into the pieces its pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matches, written out by hand over UTF-8 characters (the classes: unicode_class.h).
#pragma once

#include <string_view>
#include <vector>

namespace ds::tokenizer::detail {

// Appends the pieces of `text` to `out`, in order; together they are exactly `text`.
void pretokenize(std::string_view text, std::vector<std::string_view>& out);

}  // namespace ds::tokenizer::detail
