// A tiny byte-level BPE tokenizer for the unit tests: the 256 byte tokens with id == byte
// value, then a few merges whose effect on the test texts is worked out by hand, then
// <|endoftext|>.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "byte_unicode.h"
#include "ds/tokenizer/bpe.h"

namespace tiny {

// Merges, by rank; each one's id is 256 + rank.
inline const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"h", "e"},          // 256 he
    {"l", "l"},          // 257 ll
    {"he", "ll"},        // 258 hell
    {"hell", "o"},       // 259 hello
    {"\xC4\xA0", "w"},   // 260 " w"  (Ġ is the space byte)
    {"o", "r"},          // 261 or
    {"\xC4\xA0w", "or"}, // 262 " wor"
    {"'", "s"},          // 263 's
    {"\xC4\xA0", "\xC4\xA0"},  // 264 two spaces
    {"\xC3\x8E", "\xC2\xB1"},  // 265 α (bytes CE B1, spelled Î±)
    {"\xC3\xA4", "\xC2\xB8"},  // 266 the first two bytes of 中 (E4 B8 AD, spelled ä¸Ń)
    {"\xC3\xA4\xC2\xB8", "\xC5\x83"},  // 267 中
    {"\xC4\x8A", "\xC4\x8A"},  // 268 two line ends (Ċ is "\n"): a cut between them would show
};
inline constexpr int kEot = 269;

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out + "\"";
}

// The vocabulary as a JSON object's members (no braces).
inline std::string vocab_members(bool with_eot = true, int skip_byte = -1) {
  std::string v;
  auto add = [&](const std::string& spelling, int id) {
    if (!v.empty()) v += ",";
    v += json_string(spelling) + ":" + std::to_string(id);
  };
  for (int b = 0; b < 256; ++b)
    if (b != skip_byte) add(ds::tokenizer::detail::bytes_to_spelling(std::string(1, char(b))), b);
  for (std::size_t r = 0; r < kMerges.size(); ++r) add(kMerges[r].first + kMerges[r].second, 256 + int(r));
  if (with_eot) add("<|endoftext|>", kEot);
  return v;
}

inline std::string vocab_json() {
  std::string v = "{";
  v += vocab_members();
  return v + "}";
}

inline std::string merges_txt() {
  std::string m = "#version: 0.2\n";
  for (const auto& [a, b] : kMerges) m += a + " " + b + "\n";
  return m;
}

inline ds::tokenizer::BpeTokenizer gpt2() {
  return ds::tokenizer::BpeTokenizer::from_gpt2_files(vocab_json(), "vocab.json", merges_txt(), "merges.txt");
}

// tokenizer.json text; `model_extra` / `root_extra` are spliced into the objects
// (", \"key\": value" to add or override keys; later duplicate keys are an error, so tests
// that change a key use `pre_tokenizer` / `type` instead).
inline std::string tokenizer_json(const std::string& type = "\"BPE\"",
                                  const std::string& pre_tokenizer =
                                      "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}",
                                  const std::string& root_extra = "", const std::string& model_extra = "") {
  std::string merges;
  for (std::size_t r = 0; r < kMerges.size(); ++r) {
    if (r) merges += ",";
    // Both spellings of a merge: "a b" and ["a", "b"].
    merges += r % 2 ? json_string(kMerges[r].first + " " + kMerges[r].second)
                    : std::string("[") + json_string(kMerges[r].first) + "," + json_string(kMerges[r].second) + "]";
  }
  std::string t = "{\"version\": \"1.0\",\n";
  return t + "\"added_tokens\": [{\"id\": 269, \"content\": \"<|endoftext|>\", \"special\": true}],\n"
         "\"normalizer\": null,\n"
         "\"pre_tokenizer\": " + pre_tokenizer + ",\n" + root_extra +
         "\"model\": {\"type\": " + type + ", \"dropout\": null, \"byte_fallback\": false" + model_extra + ",\n"
         "\"vocab\": {" + vocab_members() + "},\n"
         "\"merges\": [" + merges + "]}}\n";
}

}  // namespace tiny
