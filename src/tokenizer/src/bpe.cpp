#include <limits>

#include "ds/core/error.h"
#include "impl.h"
#include "pretokenize.h"

namespace ds::tokenizer {

bool BpeTokenizer::Impl::set_token(std::int32_t id, const std::string& token_bytes) {
  const auto i = std::size_t(id);
  if (i >= bytes.size()) {
    bytes.resize(i + 1);
    known.resize(i + 1, 0);
  }
  if (known[i]) return bytes[i] == token_bytes;
  known[i] = 1;
  bytes[i] = token_bytes;
  return true;
}

void BpeTokenizer::Impl::reserve(std::size_t id_limit, std::size_t ordinary) {
  bytes.reserve(id_limit);
  known.reserve(id_limit);
  vocab.reserve(ordinary);
}

bool BpeTokenizer::Impl::add_ordinary(std::int32_t id, const std::string& token_bytes) {
  if (!set_token(id, token_bytes)) return false;
  // Different spellings never decode to the same bytes, so this adds; were it not, the first
  // id for some bytes would stay the one lookups find.
  (void)vocab.insert(id, bytes);
  return true;
}

void BpeTokenizer::Impl::encode_ordinary(std::string_view text, std::vector<std::int32_t>& out) const {
  std::vector<std::string_view> pieces;
  detail::pretokenize(text, pieces);
  // Natural text repeats its words: merge each distinct piece once per call. The keys point
  // into `text`, which outlives the cache; the bound keeps memory flat on huge inputs.
  std::unordered_map<std::string_view, std::vector<std::int32_t>> cache;
  std::vector<std::int32_t> ids;
  for (const std::string_view piece : pieces) {
    if (piece.size() == 1) {
      out.push_back(byte_id[static_cast<unsigned char>(piece[0])]);
      continue;
    }
    if (const auto it = cache.find(piece); it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      continue;
    }
    ids.clear();
    if (ignore_merges) {
      if (const std::optional<std::int32_t> id = find(piece)) ids.push_back(*id);
    }
    if (ids.empty()) {
      for (const char c : piece) ids.push_back(byte_id[static_cast<unsigned char>(c)]);
      merges.apply(ids);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (cache.size() > (std::size_t(1) << 20)) cache.clear();
    cache.emplace(piece, ids);
  }
}

void BpeTokenizer::Impl::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  constexpr std::size_t npos = std::string_view::npos;
  // The next occurrence of each special token at or after `pos`, found again only once `pos`
  // has passed it.
  std::vector<std::size_t> next(specials.size());
  for (std::size_t k = 0; k < specials.size(); ++k) next[k] = text.find(specials[k].first);
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t best = npos, best_k = 0;
    for (std::size_t k = 0; k < specials.size(); ++k) {
      if (next[k] != npos && next[k] < pos) next[k] = text.find(specials[k].first, pos);
      if (next[k] == npos) continue;
      // Leftmost first; at the same place the longest (so "<|a|>x" beats its prefix "<|a|>").
      if (next[k] < best || (next[k] == best && specials[k].first.size() > specials[best_k].first.size())) {
        best = next[k];
        best_k = k;
      }
    }
    const std::size_t end = best == npos ? text.size() : best;
    encode_ordinary(text.substr(pos, end - pos), out);
    if (best == npos) break;
    out.push_back(specials[best_k].second);
    pos = best + specials[best_k].first.size();
  }
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<std::int32_t> out;
  out.reserve(text.size() / 3 + 16);
  impl_->encode(text, out);
  return out;
}

std::string BpeTokenizer::decode(std::span<const std::int32_t> ids) const {
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::string* b = token_bytes(ids[i]);
    DS_CHECK(b != nullptr, "token " << ids[i] << " (position " << i << ") is not in the vocabulary of "
                                    << impl_->source << " (vocab size " << vocab_size() << ")");
    out += *b;
  }
  return out;
}

const std::string* BpeTokenizer::token_bytes(std::int32_t id) const {
  if (id < 0 || std::size_t(id) >= impl_->known.size() || !impl_->known[std::size_t(id)]) return nullptr;
  return &impl_->bytes[std::size_t(id)];
}

std::int64_t BpeTokenizer::vocab_size() const { return std::int64_t(impl_->bytes.size()); }

std::optional<std::int32_t> BpeTokenizer::special_token(std::string_view content) const {
  for (const auto& [text, id] : impl_->specials)
    if (text == content) return id;
  return std::nullopt;
}

const std::string& BpeTokenizer::source() const { return impl_->source; }

}  // namespace ds::tokenizer
