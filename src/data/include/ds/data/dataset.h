// Token datasets: the embedded default corpus, any text file (byte-level tokens), and the
// binary token file format for larger, pre-tokenized corpora.
//
// Token file format (little-endian), version 1:
//   offset 0   char[8]  magic "DSTOKENS"
//   offset 8   uint32   version (1)
//   offset 12  uint32   bytes per token: 1 (uint8) or 2 (uint16)
//   offset 16  uint64   token count
//   offset 24  uint32   vocab size (0 = unknown: max token + 1 is used)
//   offset 28  uint32   reserved (0)
//   offset 32  tokens, count x (bytes per token)
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ds/data/window_source.h"

namespace ds::data {

// The embedded default corpus (verbatim licence texts, see docs/user/data.md), as bytes.
std::string_view embedded_corpus();

class TextDataset : public WindowSource {
 public:
  TextDataset() = default;
  TextDataset(std::vector<std::uint16_t> tokens, std::int64_t vocab_size);

  // Byte-level tokens (vocab 256) of the embedded default corpus.
  static TextDataset embedded();
  // Byte-level tokens (vocab 256) of a text file; throws ds::Error naming the path if it is
  // missing, unreadable or empty.
  static TextDataset from_file(const std::string& path);
  // A token file (format above); errors name the path and what is wrong.
  static TextDataset from_token_file(const std::string& path);
  // Byte-level tokens of any bytes.
  static TextDataset from_bytes(std::string_view bytes);

  std::span<const std::uint16_t> tokens() const { return tokens_; }
  std::size_t size() const override { return tokens_.size(); }
  std::int64_t vocab_size() const { return vocab_; }

  // (train, validation): validation is the last `val_fraction` of the tokens (at least
  // min_val_tokens when val_fraction > 0), train everything before it.
  std::pair<TextDataset, TextDataset> split(double val_fraction, std::size_t min_val_tokens = 0) const;

  // Samples are non-overlapping windows of seq+1 tokens: sample i has inputs
  // tokens[i*seq, i*seq+seq) and targets shifted by one.
  std::size_t num_samples(std::int64_t seq) const override;
  // Writes sample `index` (inputs and targets, seq tokens each).
  void sample(std::size_t index, std::int64_t seq, std::int32_t* inputs, std::int32_t* targets) const override;

 private:
  std::vector<std::uint16_t> tokens_;
  std::int64_t vocab_ = 256;
};

// Writes tokens in the token file format; bytes per token 1 when every token < 256, else 2.
// vocab_size 0 = unknown. Throws ds::Error naming the path on failure.
void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens,
                      std::uint32_t vocab_size = 0);

}  // namespace ds::data
