#include "ds/data/dataset.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "ds/core/error.h"
#include "ds/core/file_read.h"

namespace ds::data {

namespace {
constexpr char kMagic[8] = {'D', 'S', 'T', 'O', 'K', 'E', 'N', 'S'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeader = 32;

std::vector<std::uint16_t> bytes_to_tokens(std::string_view s) {
  std::vector<std::uint16_t> t(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) t[i] = static_cast<unsigned char>(s[i]);
  return t;
}

// Only a regular file: a FIFO would block the read and a device like /dev/zero never ends.
// No size cap (data files are as large as they are).
std::string read_all(const std::string& path, const char* what) {
  return read_regular_file(path, what, UINT64_MAX);
}

template <typename T> T get(const std::string& s, std::size_t off) {
  T v;
  std::memcpy(&v, s.data() + off, sizeof(T));
  return v;
}
}  // namespace

TextDataset::TextDataset(std::vector<std::uint16_t> tokens, std::int64_t vocab_size)
    : tokens_(std::move(tokens)), vocab_(vocab_size) {}

TextDataset TextDataset::from_bytes(std::string_view bytes) { return TextDataset(bytes_to_tokens(bytes), 256); }

TextDataset TextDataset::embedded() { return from_bytes(embedded_corpus()); }

TextDataset TextDataset::from_file(const std::string& path) {
  const std::string s = read_all(path, "data file");
  DS_CHECK(!s.empty(), "data file '" << path << "' is empty");
  return from_bytes(s);
}

TextDataset TextDataset::from_token_file(const std::string& path) {
  const std::string s = read_all(path, "token file");
  DS_CHECK(s.size() >= kHeader && std::memcmp(s.data(), kMagic, 8) == 0,
           "token file '" << path << "' has no DSTOKENS header (" << s.size() << " bytes)");
  const auto version = get<std::uint32_t>(s, 8);
  const auto width = get<std::uint32_t>(s, 12);
  const auto count = get<std::uint64_t>(s, 16);
  auto vocab = get<std::uint32_t>(s, 24);
  DS_CHECK(version == kVersion, "token file '" << path << "': version " << version
                                               << " is not supported (expected " << kVersion << ")");
  DS_CHECK(width == 1 || width == 2,
           "token file '" << path << "': bytes per token " << width << " (expected 1 or 2)");
  DS_CHECK(count <= (s.size() - kHeader) / width && s.size() == kHeader + count * width,
           "token file '" << path << "': header says " << count << " tokens of " << width
                          << " bytes but the file has " << s.size() - kHeader << " payload bytes");
  std::vector<std::uint16_t> t(count);
  std::uint32_t mx = 0;
  for (std::size_t i = 0; i < count; ++i) {
    t[i] = width == 1 ? std::uint16_t(static_cast<unsigned char>(s[kHeader + i]))
                      : get<std::uint16_t>(s, kHeader + 2 * i);
    mx = std::max<std::uint32_t>(mx, t[i]);
  }
  // Tokens are 16-bit, so a larger vocabulary cannot be this file's: a header claiming one
  // (2^31) would otherwise size the model's embedding and logits from it.
  constexpr std::uint32_t kMaxVocab = 65536;
  DS_CHECK(vocab <= kMaxVocab, "token file '" << path << "': header vocab size " << vocab
                                              << " exceeds " << kMaxVocab << " (tokens are 16-bit)");
  if (vocab == 0) vocab = count ? mx + 1 : 1;
  DS_CHECK(count == 0 || mx < vocab, "token file '" << path << "': token " << mx
                                                    << " >= vocab size " << vocab);
  return TextDataset(std::move(t), vocab);
}

void write_token_file(const std::string& path, std::span<const std::uint16_t> tokens,
                      std::uint32_t vocab_size) {
  const std::uint16_t mx = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
  const std::uint32_t width = mx < 256 ? 1 : 2;
  std::string s(kHeader + tokens.size() * width, '\0');
  std::memcpy(s.data(), kMagic, 8);
  const std::uint64_t count = tokens.size();
  std::memcpy(s.data() + 8, &kVersion, 4);
  std::memcpy(s.data() + 12, &width, 4);
  std::memcpy(s.data() + 16, &count, 8);
  std::memcpy(s.data() + 24, &vocab_size, 4);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (width == 1) s[kHeader + i] = char(tokens[i]);
    else std::memcpy(s.data() + kHeader + 2 * i, &tokens[i], 2);
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  DS_CHECK(f.good(), "token file '" << path << "' cannot be created: " << std::strerror(errno));
  f.write(s.data(), std::streamsize(s.size()));
  f.close();
  DS_CHECK(f.good(), "token file '" << path << "': write failed");
}

std::pair<TextDataset, TextDataset> TextDataset::split(double val_fraction,
                                                       std::size_t min_val_tokens) const {
  DS_CHECK(val_fraction >= 0.0 && val_fraction < 1.0,
           "validation fraction must be in [0, 1), got " << val_fraction);
  std::size_t nval = std::size_t(double(tokens_.size()) * val_fraction);
  if (val_fraction > 0.0) nval = std::max(nval, min_val_tokens);
  DS_CHECK(nval < tokens_.size(), "validation split of " << nval << " tokens leaves no training data ("
                                                         << tokens_.size() << " tokens)");
  const auto cut = tokens_.begin() + std::ptrdiff_t(tokens_.size() - nval);
  return {TextDataset(std::vector<std::uint16_t>(tokens_.begin(), cut), vocab_),
          TextDataset(std::vector<std::uint16_t>(cut, tokens_.end()), vocab_)};
}

std::size_t TextDataset::num_samples(std::int64_t seq) const {
  DS_CHECK(seq > 0, "sequence length must be > 0");
  if (tokens_.size() < 2) return 0;
  return (tokens_.size() - 1) / std::size_t(seq);
}

void TextDataset::sample(std::size_t index, std::int64_t seq, std::int32_t* inputs,
                         std::int32_t* targets) const {
  DS_CHECK(index < num_samples(seq), "sample " << index << " out of range (" << num_samples(seq)
                                               << " samples of length " << seq << ")");
  const std::uint16_t* t = tokens_.data() + index * std::size_t(seq);
  for (std::int64_t i = 0; i < seq; ++i) {
    inputs[i] = t[i];
    targets[i] = t[i + 1];
  }
}

}  // namespace ds::data
