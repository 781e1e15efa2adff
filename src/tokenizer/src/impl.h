// The loaded tokenizer shared by BpeTokenizer copies (immutable after loading, so threads
// encode with it concurrently).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bpe_merge.h"
#include "ds/tokenizer/bpe.h"
#include "token_index.h"

namespace ds::tokenizer {

struct BpeTokenizer::Impl {
  std::string source;
  std::vector<std::string> bytes;  // by id
  std::vector<char> known;         // by id: the id is in the vocabulary
  std::array<std::int32_t, 256> byte_id{};
  detail::TokenIndex vocab;        // ordinary tokens' ids by their bytes (keys read from `bytes`)
  detail::MergeTable merges;
  std::vector<std::pair<std::string, std::int32_t>> specials;  // content, id
  bool ignore_merges = false;  // tokenizer.json model.ignore_merges: a piece in the vocab is one token

  // Room for ids below `id_limit` and `ordinary` ordinary tokens, so loading never grows (and
  // briefly doubles) the tables.
  void reserve(std::size_t id_limit, std::size_t ordinary);
  // Records token `id` with `token_bytes`; false when the id already has other bytes.
  bool set_token(std::int32_t id, const std::string& token_bytes);
  // Records an ordinary token: set_token, then indexed by its bytes; false as set_token.
  bool add_ordinary(std::int32_t id, const std::string& token_bytes);
  // An ordinary token's id by its bytes.
  std::optional<std::int32_t> find(std::string_view token_bytes) const { return vocab.find(token_bytes, bytes); }
  // Encodes text without special tokens in it.
  void encode_ordinary(std::string_view text, std::vector<std::int32_t>& out) const;
  void encode(std::string_view text, std::vector<std::int32_t>& out) const;
};

}  // namespace ds::tokenizer
