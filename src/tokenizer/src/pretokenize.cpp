#include "pretokenize.h"

#include "unicode_class.h"

namespace ds::tokenizer::detail {

namespace {

// Length of the contraction ('s 't 're 've 'm 'll 'd, case-sensitive as in GPT-2's pattern)
// at text[i] == '\'', or 0.
std::size_t contraction(std::string_view t, std::size_t i) {
  if (i + 1 >= t.size()) return 0;
  const char a = t[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= t.size()) return 0;
  const char b = t[i + 2];
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

}  // namespace

void pretokenize(std::string_view t, std::vector<std::string_view>& out) {
  const std::size_t n = t.size();
  std::size_t i = 0;
  while (i < n) {
    if (t[i] == '\'') {
      if (const std::size_t len = contraction(t, i)) {
        out.push_back(t.substr(i, len));
        i += len;
        continue;
      }
    }
    const Utf8Char c = next_char(t, i);
    CharClass k = classify(c.cp);
    std::size_t j = i + c.len;
    // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: one plain space joins the run after it.
    if (c.cp == ' ' && j < n) {
      const Utf8Char d = next_char(t, j);
      const CharClass kd = classify(d.cp);
      if (kd != CharClass::Space) {
        k = kd;
        j += d.len;
      }
    }
    if (k != CharClass::Space) {
      while (j < n) {
        const Utf8Char d = next_char(t, j);
        if (classify(d.cp) != k) break;
        j += d.len;
      }
      out.push_back(t.substr(i, j - i));
      i = j;
      continue;
    }
    // A whitespace run. `\s+(?!\S)`: when a non-space follows, the run's last character is
    // left for the next piece (so " word" keeps its space); a run of one is then `\s+` alone.
    std::size_t last = i;
    while (j < n) {
      const Utf8Char d = next_char(t, j);
      if (classify(d.cp) != CharClass::Space) break;
      last = j;
      j += d.len;
    }
    if (j < n && last > i) j = last;
    out.push_back(t.substr(i, j - i));
    i = j;
  }
}

}  // namespace ds::tokenizer::detail
