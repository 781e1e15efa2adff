// Encoding and decoding with the tiny tokenizer (tiny_vocab.h): expected ids worked out by
// hand from its merge ranks; exact round trips of arbitrary bytes; parallel == serial.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "tiny_vocab.h"

namespace {

using Ids = std::vector<std::int32_t>;
const ds::tokenizer::BpeTokenizer& tok() {
  static const auto t = tiny::gpt2();
  return t;
}

TEST(Bpe, MergesByRank) {
  // "hello": he(0) ll(1) hell(2) hello(3). " world": " w"(4) or(5) " wor"(6), then l d stay.
  EXPECT_EQ(tok().encode("hello world"), (Ids{259, 262, 'l', 'd'}));
  // Among equal pairs the leftmost merges first: "lll" -> ll l.
  EXPECT_EQ(tok().encode("lll"), (Ids{257, 'l'}));
  EXPECT_EQ(tok().encode("ellhe"), (Ids{'e', 257, 256}));
  EXPECT_EQ(tok().encode(""), Ids{});
}

TEST(Bpe, ContractionsAndWhitespace) {
  EXPECT_EQ(tok().encode("it's"), (Ids{'i', 't', 263}));
  // "a   b" -> "a", "  " (merged: 264), " b" (no merge for Ġb).
  EXPECT_EQ(tok().encode("a   b"), (Ids{'a', 264, ' ', 'b'}));
  // "\n\n x" -> "\n\n" (merged: 268), " x"; "a\n\nb" -> "a", "\n", "\n", "b" (two pieces).
  EXPECT_EQ(tok().encode("\n\n x"), (Ids{268, ' ', 'x'}));
  EXPECT_EQ(tok().encode("a\n\nb"), (Ids{'a', '\n', '\n', 'b'}));
  EXPECT_EQ(tok().encode("a\n\n"), (Ids{'a', 268}));
}

TEST(Bpe, MultiByteCharacters) {
  // "α中" is one letter piece: CE B1 -> α (265), E4 B8 -> 266, then 266 AD -> 中 (267).
  EXPECT_EQ(tok().encode("\xCE\xB1\xE4\xB8\xAD"), (Ids{265, 267}));
  // Without the last byte the pair stays half merged.
  EXPECT_EQ(tok().encode("\xE4\xB8"), (Ids{266}));
}

TEST(Bpe, SpecialTokensAreMatchedFirst) {
  EXPECT_EQ(tok().encode("x<|endoftext|>y"), (Ids{'x', tiny::kEot, 'y'}));
  EXPECT_EQ(tok().encode("<|endoftext|><|endoftext|>"), (Ids{tiny::kEot, tiny::kEot}));
  // A special token splits a would-be piece: " hello" on both sides stays apart.
  EXPECT_EQ(tok().encode("hello<|endoftext|>hello"), (Ids{259, tiny::kEot, 259}));
  // Not a special token: an incomplete one is ordinary text.
  EXPECT_EQ(tok().encode("<|endoftext|"), (Ids{'<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|'}));
  EXPECT_EQ(tok().special_token("<|endoftext|>"), tiny::kEot);
  EXPECT_FALSE(tok().special_token("<|im_start|>"));
  EXPECT_EQ(tok().vocab_size(), 270);
}

TEST(Bpe, DecodeInvertsExactly) {
  std::mt19937 rng(42);
  for (int len : {0, 1, 2, 3, 7, 100, 5000}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::string s(std::size_t(len), '\0');
      for (auto& c : s) c = char(rng() % 256);
      ASSERT_EQ(tok().decode(tok().encode(s)), s) << "length " << len;
    }
  }
  const std::string text = "hello world, it's  \xCE\xB1\xE4\xB8\xAD <|endoftext|>\xFF\xFE tail\n\n";
  EXPECT_EQ(tok().decode(tok().encode(text)), text);
}

TEST(Bpe, DecodeNamesAnUnknownId) {
  const Ids ids{259, 270};
  EXPECT_HAS(error_of([&] { (void)tok().decode(ids); }),
             "token 270 (position 1) is not in the vocabulary of vocab.json (vocab size 270)");
  EXPECT_EQ(tok().token_bytes(-1), nullptr);
  ASSERT_NE(tok().token_bytes(259), nullptr);
  EXPECT_EQ(*tok().token_bytes(259), "hello");
}

// Text whose lines end in every way: cuts are only allowed after a "\n" between two
// non-space characters, so the parallel result must equal the serial one.
std::string mixed_lines(int n) {
  const char* lines[] = {"hello world", "", "  indented", "trailing  ", "it's<|endoftext|>", "\t",
                         "\xCE\xB1\xE4\xB8\xAD", "x", "\xFF\xFE", "<|endoftext|>", "a   b", " ", "end<|endof"};
  std::mt19937 rng(7);
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += lines[rng() % std::size(lines)];
    s += '\n';
  }
  return s;
}

TEST(Bpe, ParallelEqualsSerial) {
  const std::string text = mixed_lines(4000);
  const Ids serial = tok().encode(text);
  for (int threads = 1; threads <= 8; ++threads)
    EXPECT_EQ(tok().encode_parallel(text, threads), serial) << threads << " threads";
  EXPECT_EQ(tok().parallel_cuts(text, 8).size(), 8u) << "the test text must be cut";
}

TEST(Bpe, ParallelCutsOnlyWhereTheEncodingHasABoundary) {
  // A cut after either "\n" of "a\n\n b" would change the pieces ("\n" "\n" " b" vs "\n\n"
  // " b" ...); after "x\n" before "y" it cannot.
  const std::string text = "a\n\n b\n  c \nx\ny";
  const auto cuts = tok().parallel_cuts(text, 4);
  ASSERT_EQ(cuts.size(), 2u);
  EXPECT_EQ(cuts[1], text.find("y"));
  EXPECT_EQ(tok().parallel_cuts("no line ends", 4).size(), 1u);
  EXPECT_HAS(error_of([] { (void)tok().encode_parallel("x", 0); }), "threads must be at least 1, got 0");
}

}  // namespace
