// Loading: GPT-2's vocab.json + merges.txt, or a Hugging Face tokenizer.json (BPE model,
// ByteLevel pre-tokenizer). Errors name the file, and the line:column and JSON key or the
// merges.txt line, so a user can find what to fix.
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>

#include "byte_unicode.h"
#include "ds/core/error.h"
#include "ds/core/excerpt.h"
#include "ds/core/file_read.h"
#include "ds/core/json.h"
#include "ds/core/text_lines.h"
#include "impl.h"

namespace ds::tokenizer {

namespace {

using ds::JsonNode;
using ds::SourcePos;
using Kind = JsonNode::Kind;

// Tokenizer files are a few MiB (Llama 3's tokenizer.json: 9 MiB); this leaves room.
constexpr std::uint64_t kMaxTokenizerFileBytes = std::uint64_t(512) << 20;

[[noreturn]] void fail_at(const std::string& source, SourcePos pos, const std::string& message) {
  if (pos.known()) DS_THROW(source << ":" << pos.line << ":" << pos.column << ": " << message);
  DS_THROW(source << ": " << message);
}

std::string quoted(const std::string& s) {
  JsonNode n;
  n.kind = Kind::String;
  n.str = s;
  return describe(n);
}

// Room for ids a file leaves unused (reserved or removed tokens) above its entry count. The
// tables are indexed by id, so without a bound one id of 2e9 would allocate 2e9 entries.
constexpr std::int64_t kUnusedIdAllowance = 65536;

// The ids a file with `entries` tokens (vocabulary and added tokens) may use: [0, limit).
std::int64_t id_limit(std::size_t entries) { return std::int64_t(entries) + kUnusedIdAllowance; }

std::int32_t token_id(const JsonNode& v, const std::string& source, const std::string& key, std::int64_t limit) {
  if (v.kind != Kind::Int || v.int_value < 0 || v.int_value >= std::numeric_limits<std::int32_t>::max())
    fail_at(source, v.pos, "key " + key + ": a token id must be an integer from 0 to 2147483646, got " + describe(v));
  if (v.int_value >= limit)
    fail_at(source, v.pos, "key " + key + ": id " + std::to_string(v.int_value) + " is too large: the file has " +
                               std::to_string(limit - kUnusedIdAllowance) + " tokens, so its ids must be below " +
                               std::to_string(limit) + " (the count + " + std::to_string(kUnusedIdAllowance) +
                               " unused ids)");
  return std::int32_t(v.int_value);
}

const JsonNode* member(const JsonNode& obj, std::string_view key) {
  const JsonNode::Member* m = obj.find(key);
  return m ? &m->value : nullptr;
}

// Adds one vocabulary entry (spelling -> id), skipping a special token already added with
// the same id. Ids must be below `limit` (id_limit). False, and nothing added, when the
// spelling is already in the vocabulary (a repeated key).
bool add_vocab_entry(BpeTokenizer::Impl& t, const JsonNode::Member& m, const std::string& source,
                     const std::string& key_prefix, std::int64_t limit) {
  const std::optional<std::string> bytes = detail::spelling_to_bytes(m.key);
  if (bytes && t.find(*bytes)) return false;
  std::string key = "\"";
  if (!key_prefix.empty()) key.append(key_prefix).append(".");
  key.append(excerpt(m.key)).append("\"");
  const std::int32_t id = token_id(m.value, source, key, limit);
  for (const auto& [content, sid] : t.specials)
    if (content == m.key && sid == id) return true;
  if (!bytes)
    fail_at(source, m.key_pos, "key " + key + " is not a byte-level token: it has a character that is not one of "
                                 "GPT-2's 256 byte characters");
  if (!t.add_ordinary(id, *bytes))
    fail_at(source, m.value.pos, "key " + key + ": id " + std::to_string(id) + " is already used by " +
                                     quoted(detail::bytes_to_spelling(t.bytes[std::size_t(id)])));
  return true;
}

[[noreturn]] void fail_not_vocab(const JsonNode& vocab, const std::string& source, const std::string& key_prefix) {
  fail_at(source, vocab.pos, (key_prefix.empty() ? std::string("the document") : "key \"" + key_prefix + "\"") +
                                 " must be an object of token -> id, got " + describe(vocab));
}

// Adds the vocabulary object's entries (tokenizer.json's model.vocab, already parsed).
void add_vocab(BpeTokenizer::Impl& t, const JsonNode& vocab, const std::string& source, const std::string& key_prefix,
               std::int64_t limit) {
  if (vocab.kind != Kind::Object) fail_not_vocab(vocab, source, key_prefix);
  t.reserve(std::size_t(limit), vocab.members.size());
  // The parser has refused repeated keys, so every entry is new.
  for (const auto& m : vocab.members) (void)add_vocab_entry(t, m, source, key_prefix, limit);
}

// Adds GPT-2's vocab.json without building its tree (1 GB for a 3-million-entry file): it
// is read once to check the syntax and count the entries, which bound the ids and size the
// tables, then again to fill them.
void add_vocab_json(BpeTokenizer::Impl& t, std::string_view text, const std::string& source) {
  std::size_t count = 0;
  const JsonNode root = parse_json_members(text, source, [&](JsonNode::Member&) {
    ++count;
    return true;
  });
  if (root.kind != Kind::Object) fail_not_vocab(root, source, "");
  const std::int64_t limit = id_limit(count);
  t.reserve(std::size_t(limit), count);
  (void)parse_json_members(text, source,
                                   [&](JsonNode::Member& m) { return add_vocab_entry(t, m, source, "", limit); });
}

// Adds merge (left, right) given by their vocabulary spellings; `where` prefixes errors.
void add_merge(BpeTokenizer::Impl& t, const std::string& left, const std::string& right, std::int32_t rank,
               const std::string& vocab_name, const std::function<void(const std::string&)>& fail) {
  auto lookup = [&](const std::string& spelling) -> std::pair<std::int32_t, std::string> {
    const std::optional<std::string> b = detail::spelling_to_bytes(spelling);
    const std::optional<std::int32_t> id = b ? t.find(*b) : std::nullopt;
    if (!id) fail("token " + quoted(spelling) + " is not in " + vocab_name);
    return {*id, *b};
  };
  const auto [l, lb] = lookup(left);
  const auto [r, rb] = lookup(right);
  const std::optional<std::int32_t> merged = t.find(lb + rb);
  if (!merged) fail("the merge result " + quoted(left + right) + " is not in " + vocab_name);
  t.merges.add(l, r, *merged, rank);
}

// Every byte must have a token, or some text could not be encoded.
void check_bytes(BpeTokenizer::Impl& t, const std::string& source) {
  for (int b = 0; b < 256; ++b) {
    const std::optional<std::int32_t> id = t.find(std::string(1, char(b)));
    if (!id) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      DS_THROW(source << ": the vocabulary has no token for byte " << hex << " (spelled "
                      << quoted(detail::bytes_to_spelling(std::string(1, char(b))))
                      << "): a byte-level BPE vocabulary needs all 256");
    }
    t.byte_id[std::size_t(b)] = *id;
  }
}

// GPT-2's vocab.json: the tokens, the byte tokens checked, <|endoftext|> as the special token.
void add_gpt2_vocab(BpeTokenizer::Impl& t, std::string_view vocab_json, const std::string& vocab_source) {
  t.source = vocab_source;
  add_vocab_json(t, vocab_json, vocab_source);
  check_bytes(t, vocab_source);
  // GPT-2's one special token; tiktoken and Hugging Face treat it as special too.
  if (const std::optional<std::int32_t> eot = t.find("<|endoftext|>")) t.specials.emplace_back("<|endoftext|>", *eot);
}

// GPT-2's merges.txt, "left right" a line by rank, after the vocabulary it refers to.
void add_gpt2_merges(BpeTokenizer::Impl& t, std::string_view merges_txt, const std::string& merges_source) {
  const std::string vocab_name = std::filesystem::path(t.source).filename().string();
  TextLines lines(merges_txt, merges_source);
  std::int32_t rank = 0;
  while (lines.next()) {
    const std::string_view line = lines.line();
    if (line.empty() || (lines.number() == 1 && line.starts_with("#version"))) continue;
    auto fail = [&](const std::string& message) { DS_THROW(lines.where() << message); };
    const std::size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size() ||
        line.find(' ', sp + 1) != std::string_view::npos)
      fail("expected two tokens separated by one space, got " + quoted(std::string(line)));
    add_merge(t, std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)), rank++, vocab_name, fail);
  }
}

std::string read_file(const std::string& path, std::string_view what) {
  return read_regular_file(path, what, kMaxTokenizerFileBytes);
}

// A tokenizer.json tree being read: errors name the file, the key path and the value's place.
struct TokenizerJson {
  const std::string& source;

  const JsonNode& require(const JsonNode& obj, std::string_view key, const std::string& path) const {
    const JsonNode* v = member(obj, key);
    if (!v) fail_at(source, obj.pos, "key \"" + path + "\" is missing");
    return *v;
  }
  // A key that must hold one of the values this tokenizer implements.
  [[noreturn]] void only(const JsonNode& v, const std::string& path, const std::string& what) const {
    fail_at(source, v.pos, "key \"" + path + "\" is " + describe(v) + ": " + what);
  }
};

// "model": a byte-level BPE with no subword prefixes or suffixes and no byte fallback.
void check_model(const TokenizerJson& doc, const JsonNode& model, BpeTokenizer::Impl& t) {
  if (model.kind != Kind::Object) doc.only(model, "model", "must be an object");
  const JsonNode& type = doc.require(model, "type", "model.type");
  if (type.kind != Kind::String || type.str != "BPE") doc.only(type, "model.type", "only \"BPE\" models are supported");
  if (const JsonNode* v = member(model, "byte_fallback"); v && !(v->kind == Kind::Bool && !v->boolean))
    doc.only(*v, "model.byte_fallback", "byte fallback (SentencePiece-style BPE) is not supported; byte-level BPE needs false");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const JsonNode* v = member(model, key);
    if (v && !(v->kind == Kind::Null || (v->kind == Kind::String && v->str.empty())))
      doc.only(*v, std::string("model.") + key, "only null or \"\" is supported");
  }
  if (const JsonNode* v = member(model, "ignore_merges")) {
    if (v->kind != Kind::Bool) doc.only(*v, "model.ignore_merges", "must be true or false");
    t.ignore_merges = v->boolean;
  }
}

// No normalizer, and GPT-2's ByteLevel pre-tokenizer without a prefix space.
void check_pre_tokenization(const TokenizerJson& doc, const JsonNode& root) {
  if (const JsonNode* v = member(root, "normalizer"); v && v->kind != Kind::Null) {
    const JsonNode* nt = v->kind == Kind::Object ? member(*v, "type") : nullptr;
    doc.only(nt ? *nt : *v, nt ? "normalizer.type" : "normalizer", "normalizers are not supported (byte-level BPE needs null)");
  }
  const JsonNode& pre = doc.require(root, "pre_tokenizer", "pre_tokenizer");
  if (pre.kind != Kind::Object) doc.only(pre, "pre_tokenizer", "must be the ByteLevel pre-tokenizer object");
  const JsonNode& pre_type = doc.require(pre, "type", "pre_tokenizer.type");
  if (pre_type.kind != Kind::String || pre_type.str != "ByteLevel")
    doc.only(pre_type, "pre_tokenizer.type", "only \"ByteLevel\" (GPT-2's pattern) is supported");
  // Hugging Face's defaults when the keys are absent: add_prefix_space true, use_regex true.
  const JsonNode* aps = member(pre, "add_prefix_space");
  if (!aps) fail_at(doc.source, pre.pos, "key \"pre_tokenizer.add_prefix_space\" is missing (its default, true, is not supported)");
  if (!(aps->kind == Kind::Bool && !aps->boolean))
    doc.only(*aps, "pre_tokenizer.add_prefix_space", "only false is supported");
  if (const JsonNode* v = member(pre, "use_regex"); v && !(v->kind == Kind::Bool && v->boolean))
    doc.only(*v, "pre_tokenizer.use_regex", "only true (GPT-2's pattern) is supported");
}

// "added_tokens": the special tokens, each an id and its content.
void add_added_tokens(const TokenizerJson& doc, const JsonNode* added, BpeTokenizer::Impl& t, std::int64_t limit) {
  if (!added || added->kind == Kind::Null) return;
  if (added->kind != Kind::Array) doc.only(*added, "added_tokens", "must be an array of token objects");
  for (std::size_t i = 0; i < added->items.size(); ++i) {
    const JsonNode& a = added->items[i];
    const std::string path = "added_tokens[" + std::to_string(i) + "]";
    if (a.kind != Kind::Object) doc.only(a, path, "must be an object with \"id\" and \"content\"");
    const std::int32_t id = token_id(doc.require(a, "id", path + ".id"), doc.source, "\"" + path + ".id\"", limit);
    const JsonNode& content = doc.require(a, "content", path + ".content");
    if (content.kind != Kind::String || content.str.empty())
      doc.only(content, path + ".content", "must be a non-empty string");
    if (!t.set_token(id, content.str))
      fail_at(doc.source, a.pos, "key \"" + path + "\": id " + std::to_string(id) + " is already used by another token");
    t.specials.emplace_back(content.str, id);
  }
}

// "model.merges", by rank; each is "left right" (older files) or ["left", "right"] (newer ones).
void add_json_merges(const TokenizerJson& doc, const JsonNode& model, BpeTokenizer::Impl& t) {
  const JsonNode& merges = doc.require(model, "merges", "model.merges");
  if (merges.kind != Kind::Array) doc.only(merges, "model.merges", "must be an array");
  for (std::size_t i = 0; i < merges.items.size(); ++i) {
    const JsonNode& m = merges.items[i];
    const std::string path = "model.merges[" + std::to_string(i) + "]";
    auto fail = [&](const std::string& message) { fail_at(doc.source, m.pos, "key \"" + path + "\": " + message); };
    std::string left, right;
    if (m.kind == Kind::String) {
      const std::size_t sp = m.str.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == m.str.size() || m.str.find(' ', sp + 1) != std::string::npos)
        fail("expected \"left right\" (two tokens separated by one space), got " + describe(m));
      left = m.str.substr(0, sp);
      right = m.str.substr(sp + 1);
    } else if (m.kind == Kind::Array && m.items.size() == 2 && m.items[0].kind == Kind::String &&
               m.items[1].kind == Kind::String) {
      left = m.items[0].str;
      right = m.items[1].str;
    } else {
      fail("expected \"left right\" or [\"left\", \"right\"], got " + describe(m));
    }
    add_merge(t, left, right, std::int32_t(i), "model.vocab", fail);
  }
}

}  // namespace

BpeTokenizer BpeTokenizer::from_gpt2_files(std::string_view vocab_json, const std::string& vocab_source,
                                           std::string_view merges_txt, const std::string& merges_source) {
  auto t = std::make_shared<Impl>();
  add_gpt2_vocab(*t, vocab_json, vocab_source);
  add_gpt2_merges(*t, merges_txt, merges_source);
  return BpeTokenizer(std::move(t));
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(std::string_view json, const std::string& source) {
  auto t = std::make_shared<Impl>();
  t->source = source;
  const JsonNode root = parse_json(json, source);
  if (root.kind != Kind::Object) fail_at(source, root.pos, "a tokenizer.json must be a JSON object");
  const TokenizerJson doc{source};
  const JsonNode& model = doc.require(root, "model", "model");
  check_model(doc, model, *t);
  check_pre_tokenization(doc, root);
  // Added tokens first: they are matched before pre-tokenization and may repeat a vocab entry.
  const JsonNode& vocab = doc.require(model, "vocab", "model.vocab");
  const JsonNode* added = member(root, "added_tokens");
  const std::int64_t limit = id_limit(vocab.members.size() + (added ? added->items.size() : 0));
  add_added_tokens(doc, added, *t, limit);
  add_vocab(*t, vocab, source, "model.vocab", limit);
  check_bytes(*t, source);
  add_json_merges(doc, model, *t);
  return BpeTokenizer(std::move(t));
}

BpeTokenizer BpeTokenizer::load(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  DS_CHECK(fs::exists(st), "tokenizer " << path << " does not exist (give a directory with vocab.json and "
                                                   "merges.txt, or a tokenizer.json)");
  if (fs::is_directory(st)) {
    const fs::path dir(path);
    const fs::path vocab = dir / "vocab.json", merges = dir / "merges.txt", json = dir / "tokenizer.json";
    if (fs::exists(vocab) || fs::exists(merges) || !fs::exists(json)) {
      DS_CHECK(fs::exists(vocab) && fs::exists(merges),
               "tokenizer directory " << path << " has no " << (fs::exists(vocab) ? merges : vocab).filename().string()
                                      << " (it needs vocab.json and merges.txt, or a tokenizer.json)");
      // One file in memory at a time: each text is dropped once its tables are built.
      auto t = std::make_shared<Impl>();
      add_gpt2_vocab(*t, read_file(vocab.string(), "tokenizer vocabulary"), vocab.string());
      add_gpt2_merges(*t, read_file(merges.string(), "tokenizer merges"), merges.string());
      return BpeTokenizer(std::move(t));
    }
    return from_tokenizer_json(read_file(json.string(), "tokenizer file"), json.string());
  }
  return from_tokenizer_json(read_file(path, "tokenizer file"), path);
}

}  // namespace ds::tokenizer
