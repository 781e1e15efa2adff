// Loading vocab.json + merges.txt and tokenizer.json (both spellings of merges, added tokens),
// from text and from disk, and the errors: each names the file, the line (and column) and the
// JSON key or merges.txt line.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "temp_dir.h"
#include "tiny_vocab.h"

namespace {

using ds::tokenizer::BpeTokenizer;
using Ids = std::vector<std::int32_t>;

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string json_error(const std::string& json) {
  return error_of([&] { (void)BpeTokenizer::from_tokenizer_json(json, "t.json"); });
}
std::string gpt2_error(const std::string& vocab, const std::string& merges) {
  return error_of([&] { (void)BpeTokenizer::from_gpt2_files(vocab, "vocab.json", merges, "merges.txt"); });
}

TEST(Load, TokenizerJsonEncodesLikeVocabAndMerges) {
  const BpeTokenizer a = tiny::gpt2();
  const BpeTokenizer b = BpeTokenizer::from_tokenizer_json(tiny::tokenizer_json(), "t.json");
  const std::string text = "hello world, it's  \xCE\xB1\xE4\xB8\xAD<|endoftext|>lll";
  EXPECT_EQ(b.encode(text), a.encode(text));
  EXPECT_EQ(b.encode("hello world<|endoftext|>"), (Ids{259, 262, 'l', 'd', tiny::kEot}));
  EXPECT_EQ(b.vocab_size(), 270);
  EXPECT_EQ(b.special_token("<|endoftext|>"), tiny::kEot);
}

TEST(Load, FromDisk) {
  TempDir d("ds_tok_load");
  write(d.path / "vocab.json", tiny::vocab_json());
  write(d.path / "merges.txt", tiny::merges_txt());
  write(d.path / "tok.json", tiny::tokenizer_json());
  EXPECT_EQ(BpeTokenizer::load(d.path.string()).encode("hello"), Ids{259});
  EXPECT_EQ(BpeTokenizer::load((d.path / "tok.json").string()).encode("hello"), Ids{259});
  EXPECT_EQ(BpeTokenizer::load((d.path / "tok.json").string()).source(), (d.path / "tok.json").string());
  // A directory with only a tokenizer.json uses it.
  TempDir j("ds_tok_json");
  write(j.path / "tokenizer.json", tiny::tokenizer_json());
  EXPECT_EQ(BpeTokenizer::load(j.path.string()).encode("hello"), Ids{259});

  EXPECT_HAS(error_of([&] { (void)BpeTokenizer::load((d.path / "nope").string()); }),
             "tokenizer " + (d.path / "nope").string() + " does not exist");
  TempDir h("ds_tok_half");
  write(h.path / "merges.txt", tiny::merges_txt());
  EXPECT_HAS(error_of([&] { (void)BpeTokenizer::load(h.path.string()); }),
             "tokenizer directory " + h.path.string() + " has no vocab.json (it needs vocab.json and merges.txt, or a tokenizer.json)");
}

TEST(Load, VocabErrors) {
  EXPECT_HAS(gpt2_error(std::string("{") + tiny::vocab_members() + ",\"xyz\": -1}", ""),
             "vocab.json:1:");
  EXPECT_HAS(gpt2_error(std::string("{") + tiny::vocab_members() + ",\"xyz\": -1}", ""),
             ": key \"xyz\": a token id must be an integer from 0 to 2147483646, got -1");
  EXPECT_HAS(gpt2_error(std::string("{") + tiny::vocab_members() + ",\n\"xyz\": \"7\"}", ""), "vocab.json:2:8: key \"xyz\"");
  EXPECT_HAS(gpt2_error(std::string("{") + tiny::vocab_members() + ",\n\"xyz\": 5}", ""),
             "vocab.json:2:8: key \"xyz\": id 5 is already used by \"\xC4\x85\"");
  // A space is not a byte character (it is spelled Ġ).
  EXPECT_HAS(gpt2_error(std::string("{") + tiny::vocab_members() + ",\n\"a b\": 300}", ""),
             "vocab.json:2:1: key \"a b\" is not a byte-level token");
  EXPECT_HAS(gpt2_error(std::string("{") + tiny::vocab_members(true, 'A') + "}", ""),
             "vocab.json: the vocabulary has no token for byte 0x41 (spelled \"A\"): a byte-level BPE vocabulary needs all 256");
  EXPECT_HAS(gpt2_error("[1, 2]", ""), "vocab.json:1:1: the document must be an object of token -> id, got an array");
  EXPECT_HAS(gpt2_error("{\"a\": 1", ""), "vocab.json:1:");  // the JSON reader's own errors keep the file
  EXPECT_HAS(gpt2_error(std::string("{") + tiny::vocab_members() + ",\n\"xyz\": 300,\n \"xyz\": 301}", ""),
             "vocab.json:3:2: duplicate key \"xyz\" (first at line 2, column 1)");
}

// vocab.json is read without building its tree (a 3-million-entry file took 1.1 GB): a
// generated vocabulary of 200,000 tokens, with a comment and a trailing comma the reader
// accepts, loads with every token at its id, and merges find tokens by their spellings.
TEST(Load, LargeVocabJson) {
  constexpr int kGenerated = 200000;
  // Distinct spellings for ids from 269: the id's base-16 digits as letters a-p, one 'q' (no
  // tiny token has one), and a 'Ġ' in front on odd ids.
  auto spelling = [](int id) {
    std::string s = id % 2 ? "\xC4\xA0" : "";
    for (int n = id; n > 0; n /= 16) s.push_back(char('a' + n % 16));
    return s + "q";
  };
  // Appended, not "{" + ...: GCC 12 reports a false -Wrestrict on operator+(const char*, string&&).
  std::string v = "{";
  v.append(tiny::vocab_members(false)).append(", // the merges' tokens, then generated ones\n");
  for (int id = 269; id < kGenerated; ++id) v += tiny::json_string(spelling(id)) + ": " + std::to_string(id) + ",\n";
  const std::string joined = spelling(123456) + spelling(199999);
  v += "\"qq\": 200000, \"qqqq\": 200001, " + tiny::json_string(joined) + ": 200002,}";
  const std::string merges = "q q\nqq qq\n" + spelling(123456) + " " + spelling(199999) + "\n";
  const BpeTokenizer tok = BpeTokenizer::from_gpt2_files(v, "vocab.json", merges, "merges.txt");
  EXPECT_EQ(tok.vocab_size(), kGenerated + 3);
  for (int id : {0, int('A'), 258, 269, 270, 123457, kGenerated - 1}) {
    const std::string* bytes = tok.token_bytes(id);
    ASSERT_NE(bytes, nullptr) << id;
    const auto& merge = tiny::kMerges[std::size_t(std::max(id - 256, 0))];
    const std::string want = id < 256   ? ds::tokenizer::detail::bytes_to_spelling(std::string(1, char(id)))
                             : id < 269 ? merge.first + merge.second
                                        : spelling(id);
    EXPECT_EQ(ds::tokenizer::detail::bytes_to_spelling(*bytes), want) << id;
  }
  EXPECT_EQ(tok.encode("qqqq"), Ids{kGenerated + 1});
  EXPECT_EQ(tok.encode("qqq"), (Ids{kGenerated, 'q'}));
  EXPECT_HAS(gpt2_error(v, "qq " + spelling(4) + "\n"), "merges.txt:1: token \"eq\" is not in vocab.json");
}

TEST(Load, IdsMustBeNearlyDense) {
  const std::string members = std::string("{") + tiny::vocab_members();  // 270 tokens
  EXPECT_HAS(gpt2_error(members + ",\n\"xyz\": 50000000}", ""),
             "vocab.json:2:8: key \"xyz\": id 50000000 is too large: the file has 271 tokens, so its ids must be "
             "below 65807 (the count + 65536 unused ids)");
  const BpeTokenizer gaps = BpeTokenizer::from_gpt2_files(members + ",\"xyz\": 65806}", "vocab.json", "", "merges.txt");
  EXPECT_EQ(gaps.vocab_size(), 65807);
  std::string added = tiny::tokenizer_json();
  added.replace(added.find("\"id\": 269"), 9, "\"id\": 2000000000");
  EXPECT_HAS(json_error(added), "key \"added_tokens[0].id\": id 2000000000 is too large: the file has 271 tokens");
}

TEST(Load, MergesErrors) {
  const std::string v = tiny::vocab_json();
  EXPECT_HAS(gpt2_error(v, "#version: 0.2\nh e\nhe\n"),
             "merges.txt:3: expected two tokens separated by one space, got \"he\"");
  EXPECT_HAS(gpt2_error(v, "h e\na b c\n"), "merges.txt:2: expected two tokens separated by one space");
  EXPECT_HAS(gpt2_error(v, "h e\nqq r\n"), "merges.txt:2: token \"qq\" is not in vocab.json");
  EXPECT_HAS(gpt2_error(v, "h e\nx y\n"), "merges.txt:2: the merge result \"xy\" is not in vocab.json");
  // CRLF line ends and a missing last newline are fine.
  EXPECT_EQ(BpeTokenizer::from_gpt2_files(v, "vocab.json", "h e\r\nl l\r\nhe ll\r\nhell o", "merges.txt").encode("hello"),
            Ids{259});
}

TEST(Load, TokenizerJsonRejectsWhatItDoesNotImplement) {
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"WordPiece\"")),
             "t.json:5:19: key \"model.type\" is \"WordPiece\": only \"BPE\" models are supported");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "{\"type\": \"Metaspace\", \"replacement\": \"_\"}")),
             "t.json:4:27: key \"pre_tokenizer.type\" is \"Metaspace\": only \"ByteLevel\" (GPT-2's pattern) is supported");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}")),
             "t.json:4:60: key \"pre_tokenizer.add_prefix_space\" is true: only false is supported");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\"}")),
             "key \"pre_tokenizer.add_prefix_space\" is missing (its default, true, is not supported)");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}")),
             "key \"pre_tokenizer.use_regex\" is false: only true (GPT-2's pattern) is supported");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "null")),
             "key \"pre_tokenizer\" is null: must be the ByteLevel pre-tokenizer object");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}",
                                             "\"decoder\": null, \"post_processor\": null, \"truncation\": null,\n")),
             "(no error)");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}",
                                             "\"x\": {\"normalizer_not\": 1},\n", ", \"continuing_subword_prefix\": \"##\"")),
             "key \"model.continuing_subword_prefix\" is \"##\": only null or \"\" is supported");
  EXPECT_HAS(json_error(tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", "",
                                             ", \"ignore_merges\": 1")),
             "key \"model.ignore_merges\" is 1: must be true or false");
  // The normalizer key comes before the pre_tokenizer one in the template: rebuild around it.
  std::string with_norm = tiny::tokenizer_json();
  with_norm.replace(with_norm.find("\"normalizer\": null"), 18, "\"normalizer\": {\"type\": \"NFC\"}");
  EXPECT_HAS(json_error(with_norm), "t.json:3:24: key \"normalizer.type\" is \"NFC\": normalizers are not supported");
  std::string byte_fallback = tiny::tokenizer_json();
  byte_fallback.replace(byte_fallback.find("\"byte_fallback\": false"), 22, "\"byte_fallback\": true");
  EXPECT_HAS(json_error(byte_fallback), "key \"model.byte_fallback\" is true: byte fallback");
  EXPECT_HAS(json_error("{\"pre_tokenizer\": null}"), "t.json:1:1: key \"model\" is missing");
  EXPECT_HAS(json_error("[]"), "t.json:1:1: a tokenizer.json must be a JSON object");
}

TEST(Load, TokenizerJsonMergeAndAddedTokenErrors) {
  std::string bad_merge = tiny::tokenizer_json();
  bad_merge.replace(bad_merge.find("[\"h\",\"e\"]"), 9, "[\"h\",\"e\",\"x\"]");
  EXPECT_HAS(json_error(bad_merge), "key \"model.merges[0]\": expected \"left right\" or [\"left\", \"right\"], got an array");
  std::string unknown = tiny::tokenizer_json();
  unknown.replace(unknown.find("[\"h\",\"e\"]"), 9, "\"h qq\"");
  EXPECT_HAS(json_error(unknown), "key \"model.merges[0]\": token \"qq\" is not in model.vocab");
  std::string added = tiny::tokenizer_json();
  added.replace(added.find("\"id\": 269"), 9, "\"id\": 65");
  // The vocabulary's "A" (65) then collides with the added token.
  EXPECT_HAS(json_error(added), "key \"model.vocab.A\": id 65 is already used by \"<|endoftext|>\"");
  std::string twice = tiny::tokenizer_json();
  twice.replace(twice.find("\"added_tokens\": ["), 17,
                "\"added_tokens\": [{\"id\": 269, \"content\": \"<|x|>\"},");
  EXPECT_HAS(json_error(twice), "t.json:2:50: key \"added_tokens[1]\": id 269 is already used by another token");
  std::string no_content = tiny::tokenizer_json();
  no_content.replace(no_content.find("\"content\": \"<|endoftext|>\""), 26, "\"content\": \"\"");
  EXPECT_HAS(json_error(no_content), "key \"added_tokens[0].content\" is \"\": must be a non-empty string");
}

TEST(Load, AddedTokensAndIgnoreMerges) {
  // An added token that is not in model.vocab (as Llama 3's), with a line end inside it: it
  // is matched first, and the parallel cuts never fall inside one.
  std::string t = tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}");
  t.replace(t.find("\"added_tokens\": ["), 17,
            "\"added_tokens\": [{\"id\": 300, \"content\": \"y\\nz\", \"special\": false},");
  const BpeTokenizer tok = BpeTokenizer::from_tokenizer_json(t, "t.json");
  EXPECT_EQ(tok.vocab_size(), 301);
  EXPECT_EQ(tok.encode("x\ny\nz\nw"), (Ids{'x', '\n', 300, '\n', 'w'}));
  const auto cuts = tok.parallel_cuts("x\ny\nz\nw", 2);
  ASSERT_EQ(cuts.size(), 2u);
  EXPECT_EQ(cuts[1], 6u) << "the cut after \"y\\n\" would split the added token";
  EXPECT_EQ(tok.decode(tok.encode("x\ny\nz\nw")), "x\ny\nz\nw");
  // ignore_merges (Llama 3): a piece that is a vocabulary token is that token, merges or not.
  const std::string im = tiny::tokenizer_json("\"BPE\"", "{\"type\": \"ByteLevel\", \"add_prefix_space\": false}", "",
                                              ", \"ignore_merges\": true");
  EXPECT_EQ(BpeTokenizer::from_tokenizer_json(im, "t.json").encode("hello"), Ids{259});
}

}  // namespace
