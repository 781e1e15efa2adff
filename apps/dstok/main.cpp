// dstok: byte-level BPE tokenization of text into llm.c token shards, and back.
//   dstok encode --tokenizer DIR_OR_JSON --input text.txt --output out/prefix [--shard_tokens N]
//                [--threads T] [--eot] [--force]
//   dstok decode --tokenizer DIR_OR_JSON --input out/prefix_000000.bin [--data_dtype uint16|uint32]
// Encoding is deterministic: the same shards for any --threads (ds/tokenizer/bpe.h).
#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cli_usage.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/core/file_read.h"
#include "ds/data/token_shards.h"
#include "ds/tokenizer/bpe.h"
#include "shard_file.h"
#include "shard_output.h"

namespace fs = std::filesystem;
using namespace ds;

namespace {

struct EncodeArgs {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string output;
  std::int64_t shard_tokens = 100'000'000;  // llm.c's fineweb.py shard size
  int threads = int(std::max(1u, std::thread::hardware_concurrency()));
  bool eot = false;
  bool force = false;
};

struct DecodeArgs {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string data_dtype;  // raw token files: "uint16" or "uint32", as train --data_dtype
};

// Typical text is 3 to 5 bytes per BPE token; 6 keeps the check before encoding from
// refusing output that would fit. The exact size is checked again before writing.
constexpr std::uint64_t kBytesPerTokenEstimate = 6;

std::uint64_t input_bytes(const std::vector<std::string>& inputs) {
  std::uint64_t total = 0;
  for (const std::string& in : inputs) {
    std::error_code ec;
    const auto n = fs::file_size(in, ec);
    if (!ec) total += n;  // a bad input is reported when it is read
  }
  return total;
}

// The text's tokens, each input one document (with --eot each starts with <|endoftext|>, as
// llm.c's data scripts write them). `bytes` receives the text size.
std::vector<std::int32_t> encode_inputs(const EncodeArgs& a, const tokenizer::BpeTokenizer& tok, std::uint64_t& bytes) {
  std::int32_t eot = -1;
  if (a.eot) {
    const auto id = tok.special_token("<|endoftext|>");
    DS_CHECK(id, "--eot: tokenizer " << tok.source() << " has no <|endoftext|> token");
    eot = *id;
  }
  std::vector<std::int32_t> tokens;
  bytes = 0;
  for (const std::string& in : a.inputs) {
    const std::string text = read_regular_file(in, "--input", std::numeric_limits<std::uint64_t>::max());
    bytes += text.size();
    if (a.eot) tokens.push_back(eot);
    const std::vector<std::int32_t> ids = tok.encode_parallel(text, a.threads);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  DS_CHECK(!tokens.empty(), "--input " << a.inputs.front() << ": nothing to encode (empty input)");
  return tokens;
}

int encode(const EncodeArgs& a) {
  tools::ShardOutput out(a.output, a.force);  // existing shards, directory: before any work
  const tokenizer::BpeTokenizer tok = tokenizer::BpeTokenizer::load(a.tokenizer);
  const int version = tools::shard_version_for(tok.vocab_size());
  out.check_space(tools::shard_file_bytes(input_bytes(a.inputs) / kBytesPerTokenEstimate, version),
                  "estimated before encoding at one token per " + std::to_string(kBytesPerTokenEstimate) +
                      " bytes of text");
  std::uint64_t bytes = 0;
  const std::vector<std::int32_t> tokens = encode_inputs(a, tok, bytes);

  const auto per_shard = std::size_t(a.shard_tokens);
  const std::size_t shards = (tokens.size() + per_shard - 1) / per_shard;
  out.check_space(tools::shard_file_bytes(tokens.size(), version) + (shards - 1) * data::kLlmcHeaderBytes,
                  std::to_string(tokens.size()) + " tokens in " + std::to_string(shards) + " shard(s)");
  std::vector<std::pair<std::string, std::size_t>> written;
  for (std::size_t at = 0; at < tokens.size(); at += per_shard) {
    const std::size_t n = std::min(tokens.size() - at, per_shard);
    written.emplace_back(out.write(std::span<const std::int32_t>(tokens).subspan(at, n), version), n);
  }
  out.commit();
  for (const auto& [path, n] : written) std::printf("dstok: wrote %s (%zu tokens)\n", path.c_str(), n);
  std::printf("dstok: %zu tokens from %llu bytes in %zu shard(s), vocab size %lld, %s tokens (version %d)\n",
              tokens.size(), static_cast<unsigned long long>(bytes), shards,
              static_cast<long long>(tok.vocab_size()), version == 1 ? "uint16" : "uint32", version);
  return 0;
}

// One file's ids, read as train --data reads it (llm.c shards of either magic, or raw tokens
// with --data_dtype), checked against the tokenizer.
std::vector<std::int32_t> read_ids(const std::string& in, const DecodeArgs& d, const tokenizer::BpeTokenizer& tok) {
  DS_CHECK(!d.data_dtype.empty() || data::TokenShards::has_llmc_magic(in),
           "--input " << in << " is not an llm.c token shard (no magic " << data::kLlmcMagic << " or "
                      << data::kLlmcMagicLlama3 << " at byte 0); for a raw token file give --data_dtype uint16 or uint32");
  const data::TokenShards shards = data::TokenShards::open(in, d.data_dtype == "uint32" ? 4 : 2);
  std::vector<std::int32_t> ids;
  ids.reserve(shards.size());
  for (std::size_t k = 0; k < shards.pieces().size(); ++k) {
    for (std::size_t i = 0; i < shards.pieces()[k].count; ++i) {
      const std::uint32_t t = shards.token(k, i);
      DS_CHECK(std::int64_t(t) < tok.vocab_size() && tok.token_bytes(std::int32_t(t)),
               "--input " << in << ": token " << t << " at position " << ids.size() << " is not in the vocabulary of "
                          << tok.source() << " (vocab size " << tok.vocab_size() << ")");
      ids.push_back(std::int32_t(t));
    }
  }
  return ids;
}

int decode(const DecodeArgs& d) {
  const tokenizer::BpeTokenizer tok = tokenizer::BpeTokenizer::load(d.tokenizer);
  for (const std::string& in : d.inputs) {
    const std::string text = tok.decode(read_ids(in, d, tok));
    if (!text.empty() && std::fwrite(text.data(), text.size(), 1, stdout) != 1)
      DS_THROW("writing the decoded text to stdout failed");
  }
  DS_CHECK(std::fflush(stdout) == 0, "writing the decoded text to stdout failed");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  ds::log::set_tool("dstok");  // diagnostics on stderr, no rank tag
  CLI::App app{"dstok: BPE-tokenize text into llm.c token shards (encode) or print a shard's text (decode)"};
  app.require_subcommand(1);
  EncodeArgs e;
  auto* enc = app.add_subcommand("encode", "text files -> PREFIX_000000.bin, PREFIX_000001.bin, ...");
  enc->add_option("--tokenizer", e.tokenizer, "directory with vocab.json + merges.txt, or a tokenizer.json")->required();
  enc->add_option("--input", e.inputs, "text file (repeat for several documents, encoded in order)")->required();
  enc->add_option("--output", e.output, "output prefix: shards are PREFIX_000000.bin, ...")->required();
  enc->add_option("--shard_tokens", e.shard_tokens, "tokens per shard (default 100000000)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{std::numeric_limits<std::int32_t>::max()}));
  enc->add_option("--threads", e.threads, "encoding threads (default: the CPU count; same output for any)")
      ->check(CLI::Range(1, 1024));
  enc->add_flag("--eot", e.eot, "start each input with <|endoftext|> (llm.c's document separator)");
  enc->add_flag("--force", e.force, "replace the prefix's existing shards (and remove its higher-numbered ones)");

  DecodeArgs d;
  auto* dec = app.add_subcommand("decode", "shard(s) -> text on stdout");
  dec->add_option("--tokenizer", d.tokenizer, "directory with vocab.json + merges.txt, or a tokenizer.json")
      ->required();
  dec->add_option("--input", d.inputs, "token shard (repeat for several, printed in order)")->required();
  dec->add_option("--data_dtype", d.data_dtype, "token width of raw token files (without an llm.c header)")
      ->check(CLI::IsMember({"uint16", "uint32"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    return tools::usage_exit(app, err, "dstok");
  }
  try {
    env::check_all();  // a bad DS_* value: one error line before any work, as every tool
    return enc->parsed() ? encode(e) : decode(d);
  } catch (const std::exception& err) {
    std::fflush(stdout);
    std::fprintf(stderr, "dstok: error: %s\n", ds::user_message(err).c_str());
    return 1;
  }
}
