// Byte-level BPE tokenizer as GPT-2, tiktoken's "gpt2" and Hugging Face's ByteLevel BPE use it.
//
// Encoding: special tokens (added tokens such as <|endoftext|>) are matched in the text first,
// leftmost and then longest; the text between them is split by GPT-2's pre-tokenizer pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// and each piece's bytes are merged by the BPE merge ranks (lowest rank first, leftmost among
// equals, as Hugging Face's BPE model does). Decoding concatenates the tokens' bytes, so
// decode(encode(s)) == s for every byte string, invalid UTF-8 included.
//
// The letter/number/space classes cover the scripts in unicode_class.cpp (ASCII, Latin-1 and
// Latin Extended, Greek, Cyrillic, Armenian, Hebrew, Arabic digits and letters, Kana, CJK,
// Hangul, full-width forms), not all of Unicode; bytes that are not valid UTF-8 count as
// punctuation. Text outside those scripts still round-trips; only its split into pieces may
// differ from the reference implementations.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::tokenizer {

class BpeTokenizer {
 public:
  // `path` is a directory holding GPT-2's vocab.json and merges.txt (or a tokenizer.json), or
  // a Hugging Face tokenizer.json file. Errors (ds::Error) name the file and the JSON key or line.
  static BpeTokenizer load(const std::string& path);
  // The same from text already read; the source names appear in the error messages.
  static BpeTokenizer from_gpt2_files(std::string_view vocab_json, const std::string& vocab_source,
                                      std::string_view merges_txt, const std::string& merges_source);
  static BpeTokenizer from_tokenizer_json(std::string_view json, const std::string& source);

  std::vector<std::int32_t> encode(std::string_view text) const;
  // The same ids as encode(text), computed by `threads` threads on pieces of the text cut at
  // line ends where the cut cannot change the result (parallel_encode.cpp).
  std::vector<std::int32_t> encode_parallel(std::string_view text, int threads) const;
  // The start offsets of the pieces encode_parallel uses (first 0; at most `parts` of them).
  std::vector<std::size_t> parallel_cuts(std::string_view text, int parts) const;

  // Throws ds::Error naming the id when one is not in the vocabulary.
  std::string decode(std::span<const std::int32_t> ids) const;
  // A token's bytes, or nullptr when the id is not in the vocabulary.
  const std::string* token_bytes(std::int32_t id) const;

  // One more than the largest token id (ids need not be dense).
  std::int64_t vocab_size() const;
  // The id of a special (added) token by its text, e.g. "<|endoftext|>".
  std::optional<std::int32_t> special_token(std::string_view content) const;
  // What it was loaded from (a path, or the source name given).
  const std::string& source() const;

  struct Impl;

 private:
  explicit BpeTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace ds::tokenizer
