// The loaded tokenizer shared by BpeTokenizer copies (immutable after loading, so threads
// encode with it concurrently).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bpe_merge.h"
#include "ds/tokenizer/bpe.h"

namespace ds::tokenizer {

struct BpeTokenizer::Impl {
  std::string source;
  std::vector<std::string> bytes;  // by id
  std::vector<char> known;         // by id: the id is in the vocabulary
  std::array<std::int32_t, 256> byte_id{};
  std::unordered_map<std::string, std::int32_t> vocab;  // ordinary tokens by their bytes
  detail::MergeTable merges;
  std::vector<std::pair<std::string, std::int32_t>> specials;  // content, id
  bool ignore_merges = false;  // tokenizer.json model.ignore_merges: a piece in the vocab is one token

  // Records token `id` with `token_bytes`; false when the id already has other bytes.
  bool set_token(std::int32_t id, const std::string& token_bytes);
  // Encodes text without special tokens in it.
  void encode_ordinary(std::string_view text, std::vector<std::int32_t>& out) const;
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
};

}  // namespace ds::tokenizer
