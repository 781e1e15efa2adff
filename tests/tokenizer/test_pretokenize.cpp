// GPT-2's pre-tokenizer pattern, case by case: every expected split is worked out by hand
// from the pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pretokenize.h"
#include "unicode_class.h"

namespace {

std::vector<std::string> pieces(const std::string& text) {
  std::vector<std::string_view> v;
  ds::tokenizer::detail::pretokenize(text, v);
  std::string joined;
  for (auto p : v) joined += p;
  EXPECT_EQ(joined, text) << "the pieces must cover the text exactly";
  return {v.begin(), v.end()};
}

using V = std::vector<std::string>;

TEST(Pretokenize, WordsKeepTheirLeadingSpace) {
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces(""), V{});
  EXPECT_EQ(pieces(" x"), V{" x"});
}

TEST(Pretokenize, Contractions) {
  EXPECT_EQ(pieces("don't"), (V{"don", "'t"}));
  EXPECT_EQ(pieces("we're they've I'm you'll he'd it's"),
            (V{"we", "'re", " they", "'ve", " I", "'m", " you", "'ll", " he", "'d", " it", "'s"}));
  // Case-sensitive, as GPT-2's pattern: 'T is punctuation then a letter.
  EXPECT_EQ(pieces("DON'T"), (V{"DON", "'", "T"}));
  EXPECT_EQ(pieces("y'all"), (V{"y", "'", "all"}));
  EXPECT_EQ(pieces("'''"), V{"'''"});
  EXPECT_EQ(pieces("'s'"), (V{"'s", "'"}));
  EXPECT_EQ(pieces("x'"), (V{"x", "'"}));
}

TEST(Pretokenize, WhitespaceRuns) {
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));
  EXPECT_EQ(pieces("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(pieces("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pieces("x   "), (V{"x", "   "}));
  EXPECT_EQ(pieces("   x"), (V{"  ", " x"}));
  EXPECT_EQ(pieces("\t\tx"), (V{"\t", "\t", "x"}));
  EXPECT_EQ(pieces("\n"), V{"\n"});
  EXPECT_EQ(pieces("a \u3000b"), (V{"a", " ", "\u3000", "b"}));  // ideographic space: \s, not ' '
  EXPECT_EQ(pieces("a\u00A0\u00A0b"), (V{"a", "\u00A0", "\u00A0", "b"}));
}

TEST(Pretokenize, NumbersAndPunctuation) {
  EXPECT_EQ(pieces("abc123 456"), (V{"abc", "123", " 456"}));
  EXPECT_EQ(pieces("$100!!"), (V{"$", "100", "!!"}));
  EXPECT_EQ(pieces("a !?b"), (V{"a", " !?", "b"}));
  EXPECT_EQ(pieces("x_y"), (V{"x", "_", "y"}));
  EXPECT_EQ(pieces("x\u00B2 \u2167"), (V{"x", "\u00B2", " \u2167"}));  // superscript two, Roman numeral eight
  EXPECT_EQ(pieces("\uFF15\uFF10"), V{"\uFF15\uFF10"});                // full-width digits
}

TEST(Pretokenize, Scripts) {
  EXPECT_EQ(pieces("Ελληνικά Русский café"), (V{"Ελληνικά", " Русский", " café"}));
  EXPECT_EQ(pieces("中文。日本語のテキスト"), (V{"中文", "。", "日本語のテキスト"}));
  EXPECT_EQ(pieces("한국어 ok"), (V{"한국어", " ok"}));
  EXPECT_EQ(pieces("x×y"), (V{"x", "×", "y"}));  // the multiplication sign is a symbol
  EXPECT_EQ(pieces("🙂🙂 ok"), (V{"🙂🙂", " ok"}));
}

TEST(Pretokenize, InvalidUtf8IsPunctuation) {
  EXPECT_EQ(pieces("a\xFF\xFE" "b"), (V{"a", "\xFF\xFE", "b"}));
  EXPECT_EQ(pieces(" \xC3"), V{" \xC3"});        // a lead byte without its continuation
  EXPECT_EQ(pieces("\xC0\x80x"), (V{"\xC0\x80", "x"}));  // overlong NUL
  EXPECT_EQ(pieces("\xED\xA0\x80"), V{"\xED\xA0\x80"});  // a surrogate
}

TEST(Utf8, DecodesAndRejects) {
  using ds::tokenizer::detail::kInvalidChar;
  using ds::tokenizer::detail::next_char;
  EXPECT_EQ(next_char("\xE4\xB8\xAD", 0).cp, char32_t(0x4E2D));
  EXPECT_EQ(next_char("\xE4\xB8\xAD", 0).len, 3u);
  EXPECT_EQ(next_char("\xF0\x9F\x99\x82", 0).cp, char32_t(0x1F642));
  EXPECT_EQ(next_char("\xE4\xB8", 0).cp, kInvalidChar);
  EXPECT_EQ(next_char("\xE4\xB8", 0).len, 1u);
  EXPECT_EQ(next_char("\xF4\x90\x80\x80", 0).cp, kInvalidChar);  // above U+10FFFF
}

}  // namespace

#include "byte_unicode.h"

namespace {

TEST(ByteMap, GPT2Spellings) {
  using namespace ds::tokenizer::detail;
  // Printable Latin-1 bytes stand for themselves; the others count up from U+0100 in order.
  EXPECT_EQ(byte_to_char('A'), U'A');
  EXPECT_EQ(byte_to_char(0x00), char32_t(0x100));
  EXPECT_EQ(byte_to_char('\n'), char32_t(0x10A));  // Ċ
  EXPECT_EQ(byte_to_char(' '), char32_t(0x120));   // Ġ
  EXPECT_EQ(byte_to_char(0x7F), char32_t(0x121));
  EXPECT_EQ(byte_to_char(0xA0), char32_t(0x142));
  EXPECT_EQ(byte_to_char(0xAD), char32_t(0x143));  // Ń
  EXPECT_EQ(byte_to_char(0xFF), char32_t(0xFF));
  EXPECT_EQ(bytes_to_spelling(" the"), "\xC4\xA0the");
  EXPECT_EQ(spelling_to_bytes("\xC4\xA0the"), std::optional<std::string>(" the"));
  EXPECT_FALSE(spelling_to_bytes("\xC4\xA0 the"));  // a raw space is not a byte character
  EXPECT_FALSE(spelling_to_bytes("\xE4\xB8\xAD"));  // nor is 中
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(char(b));
  EXPECT_EQ(spelling_to_bytes(bytes_to_spelling(all)), std::optional<std::string>(all));
}

}  // namespace
