// dstok: byte-level BPE tokenization of text into llm.c token shards, and back.
//   dstok encode --tokenizer DIR_OR_JSON --input text.txt --output out/prefix [--shard_tokens N]
//                [--threads T] [--eot]
//   dstok decode --tokenizer DIR_OR_JSON --input out/prefix_000000.bin
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
#include "ds/core/file_read.h"
#include "ds/tokenizer/bpe.h"
#include "shard_file.h"

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
};

std::string shard_path(const std::string& prefix, std::size_t index) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "_%06zu.bin", index);
  return prefix + suffix;
}

int encode(const EncodeArgs& a) {
  const fs::path parent = fs::path(a.output).parent_path();
  DS_CHECK(parent.empty() || fs::is_directory(parent),
           "--output " << a.output << ": directory " << parent.string() << " does not exist");
  DS_CHECK(!a.output.empty() && a.output.back() != '/',
           "--output " << a.output << ": give a file name prefix (shards are PREFIX_000000.bin, ...)");
  const tokenizer::BpeTokenizer tok = tokenizer::BpeTokenizer::load(a.tokenizer);
  std::int32_t eot = -1;
  if (a.eot) {
    const auto id = tok.special_token("<|endoftext|>");
    DS_CHECK(id, "--eot: tokenizer " << tok.source() << " has no <|endoftext|> token");
    eot = *id;
  }
  // Each input is one document; with --eot each starts with <|endoftext|>, as llm.c's data
  // scripts write them.
  std::vector<std::int32_t> tokens;
  std::uint64_t bytes = 0;
  for (const std::string& in : a.inputs) {
    const std::string text = read_regular_file(in, "--input", std::numeric_limits<std::uint64_t>::max());
    bytes += text.size();
    if (a.eot) tokens.push_back(eot);
    const std::vector<std::int32_t> ids = tok.encode_parallel(text, a.threads);
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  }
  DS_CHECK(!tokens.empty(), "--input " << a.inputs.front() << ": nothing to encode (empty input)");

  const int version = tools::shard_version_for(tok.vocab_size());
  std::size_t shards = 0;
  for (std::size_t at = 0; at < tokens.size(); at += std::size_t(a.shard_tokens), ++shards) {
    const std::size_t n = std::min(tokens.size() - at, std::size_t(a.shard_tokens));
    const std::string path = shard_path(a.output, shards);
    tools::write_shard(path, std::span<const std::int32_t>(tokens).subspan(at, n), version);
    std::printf("dstok: wrote %s (%zu tokens)\n", path.c_str(), n);
  }
  std::printf("dstok: %zu tokens from %llu bytes in %zu shard(s), vocab size %lld, %s tokens (version %d)\n",
              tokens.size(), static_cast<unsigned long long>(bytes), shards,
              static_cast<long long>(tok.vocab_size()), version == 1 ? "uint16" : "uint32", version);
  return 0;
}

int decode(const std::string& tokenizer_path, const std::vector<std::string>& inputs) {
  const tokenizer::BpeTokenizer tok = tokenizer::BpeTokenizer::load(tokenizer_path);
  for (const std::string& in : inputs) {
    const std::vector<std::int32_t> ids = tools::read_shard(in, "--input");
    for (std::size_t i = 0; i < ids.size(); ++i)
      DS_CHECK(tok.token_bytes(ids[i]), "--input " << in << ": token " << ids[i] << " at position " << i
                                                   << " is not in the vocabulary of " << tok.source()
                                                   << " (vocab size " << tok.vocab_size() << ")");
    const std::string text = tok.decode(ids);
    if (!text.empty() && std::fwrite(text.data(), text.size(), 1, stdout) != 1)
      DS_THROW("writing the decoded text to stdout failed");
  }
  DS_CHECK(std::fflush(stdout) == 0, "writing the decoded text to stdout failed");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
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

  std::string dec_tokenizer;
  std::vector<std::string> dec_inputs;
  auto* dec = app.add_subcommand("decode", "shard(s) -> text on stdout");
  dec->add_option("--tokenizer", dec_tokenizer, "directory with vocab.json + merges.txt, or a tokenizer.json")
      ->required();
  dec->add_option("--input", dec_inputs, "token shard (repeat for several, printed in order)")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& err) {
    return tools::usage_exit(app, err, "dstok");
  }
  try {
    env::check_all();  // a bad DS_* value: one error line before any work, as every tool
    return enc->parsed() ? encode(e) : decode(dec_tokenizer, dec_inputs);
  } catch (const std::exception& err) {
    std::fflush(stdout);
    std::fprintf(stderr, "dstok: error: %s\n", err.what());
    return 1;
  }
}
