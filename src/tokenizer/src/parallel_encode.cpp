// Parallel encoding: the text is cut into pieces encoded on their own and concatenated. A cut
// is made only where the whole text's encoding has a boundary too, so the result is the same
// for any number of threads: right after a '\n' that is its own pre-tokenizer piece (a
// non-space character before it and after it; a longer whitespace run would be split
// differently when cut, see `\s+(?!\S)`) and with no special token spanning the cut. The
// pre-tokenizer never looks behind, so the piece after the cut starts the same either way.
#include <exception>

#include "ds/core/error.h"
#include "impl.h"
#include "run_parallel.h"
#include "unicode_class.h"

namespace ds::tokenizer {

namespace {

using detail::CharClass;

bool is_space_at(std::string_view t, std::size_t i) {
  return detail::classify(detail::next_char(t, i).cp) == CharClass::Space;
}

bool safe_cut(std::string_view t, std::size_t p, const std::vector<std::pair<std::string, std::int32_t>>& specials) {
  if (p < 2 || p >= t.size() || t[p - 1] != '\n' || is_space_at(t, p)) return false;
  // The character before the '\n': decode from the line's start (a '\n' is always a whole
  // character, so decoding from there agrees with decoding the whole text).
  const std::size_t line = t.rfind('\n', p - 2);
  std::size_t i = line == std::string_view::npos ? 0 : line + 1;
  if (i == p - 1) return false;  // an empty line: "\n\n" is one whitespace run
  std::size_t last = i;
  while (i < p - 1) {
    last = i;
    i += detail::next_char(t, i).len;
  }
  if (i != p - 1 || is_space_at(t, last)) return false;
  for (const auto& [content, id] : specials) {
    const std::size_t len = content.size();
    if (len < 2) continue;
    const std::size_t lo = p >= len - 1 ? p - (len - 1) : 0;
    // Every occurrence inside [lo, p + len - 1) starts before p and ends after it.
    if (t.substr(lo, p - lo + len - 1).find(content) != std::string_view::npos) return false;
  }
  return true;
}

}  // namespace

std::vector<std::size_t> BpeTokenizer::parallel_cuts(std::string_view text, int parts) const {
  std::vector<std::size_t> cuts{0};
  for (int k = 1; k < parts; ++k) {
    std::size_t p = std::max(cuts.back() + 1, text.size() * std::size_t(k) / std::size_t(parts));
    // The first safe cut at or after the even share; none: the rest is one piece.
    while (p < text.size()) {
      const std::size_t nl = text.find('\n', p - 1);
      if (nl == std::string_view::npos) {
        p = text.size();
        break;
      }
      p = nl + 1;
      if (safe_cut(text, p, impl_->specials)) break;
      ++p;
    }
    if (p >= text.size()) break;
    cuts.push_back(p);
  }
  return cuts;
}

std::vector<std::int32_t> BpeTokenizer::encode_parallel(std::string_view text, int threads) const {
  DS_CHECK(threads >= 1, "encode_parallel: threads must be at least 1, got " << threads);
  const std::vector<std::size_t> cuts = parallel_cuts(text, threads);
  if (cuts.size() == 1) return encode(text);
  std::vector<std::vector<std::int32_t>> parts(cuts.size());
  std::vector<std::exception_ptr> errors(cuts.size());
  detail::run_parallel(cuts.size(), [&](std::size_t k) {
    const std::size_t end = k + 1 < cuts.size() ? cuts[k + 1] : text.size();
    try {
      parts[k] = encode(text.substr(cuts[k], end - cuts[k]));
    } catch (...) {
      errors[k] = std::current_exception();
    }
  });
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::size_t total = 0;
  for (const auto& p : parts) total += p.size();
  std::vector<std::int32_t> out;
  out.reserve(total);
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

}  // namespace ds::tokenizer
