// Pre-tokenized data as nanoGPT and llm.c write it, memory-mapped (read-only) and exposed as
// one logical token stream of training windows.
//
// Formats (all little-endian):
//   raw (nanoGPT's prepare.py: np.array(ids, dtype=np.uint16).tofile("train.bin")): no header,
//       the whole file is tokens, uint16 (2 bytes) or uint32 (4 bytes, for vocabularies above
//       65535; the caller says which: train's --data_dtype).
//   llm.c shard (llm.c's write_datafile): 256 x int32 header (1024 bytes),
//       header[0] = magic, header[1] = version, header[2] = token count, then the tokens.
//       Magic 20240520 (llm.c's GPT-2 shards): version 1 = uint16 tokens; version 2 = uint32
//       tokens (our extension for vocabularies above 65535: the same layout, 4-byte tokens).
//       Magic 20240801 (llm.c's Llama 3 shards): version 7 = uint32 tokens.
//       Each file of a set carries its own width.
// A set of files (one path, or a glob sorted by name) is all llm.c shards or all raw: the first
// file decides. Windows of seq+1 tokens never straddle two files: each file (piece) gives
// (tokens - 1) / seq windows of its own, the tail of a file that fills no window is unused.
// Window index i counts through the pieces in order, so the sampler's state (epoch, step) picks
// the same windows again after a resume.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ds/data/window_source.h"

namespace ds::data {

inline constexpr std::int32_t kLlmcMagic = 20240520;        // GPT-2 shards (uint16; v2: uint32)
inline constexpr std::int32_t kLlmcMagicLlama3 = 20240801;  // Llama 3 shards (v7: uint32)
inline constexpr std::size_t kLlmcHeaderBytes = 256 * sizeof(std::int32_t);
// The largest vocabulary taken from the data when the model's is not set (real ones are up to
// a few hundred thousand ids): one corrupt id of 4e9 must not size a model's embedding.
inline constexpr std::int64_t kMaxImpliedVocab = std::int64_t(1) << 21;
// Memory maps kept free for the rest of the process (allocations, threads, libraries) when
// checking that a set of files can be mapped, one map each, under vm.max_map_count.
inline constexpr std::size_t kMapCountReserve = 1024;

class TokenShards : public WindowSource {
 public:
  // A contiguous run of one file's tokens.
  struct Piece {
    std::shared_ptr<const void> map;  // the file's mapping (munmap when the last piece goes)
    std::string path;
    std::size_t header_bytes = 0;     // byte offset of token 0 in the file
    int width = 2;                    // bytes per token: 2 or 4
    std::size_t first = 0;            // first token of the piece (index into the file's tokens)
    std::size_t count = 0;            // tokens in the piece
  };

  TokenShards() = default;

  // Opens one file or every file matching a glob (sorted by name). raw_width (2 or 4) is the
  // token width of files without an llm.c header. Throws ds::Error naming the pattern when
  // nothing matches (or names the symlink loop that hides the files), when the files are
  // more than the process may map (vm.max_map_count), and the file and byte offset on a wrong
  // magic, an unsupported version, a truncated or odd-sized file.
  static TokenShards open(const std::string& pattern, int raw_width = 2);

  // Throws ds::Error naming the pattern, the file count and the limit unless `files` more
  // memory maps fit beside `maps_in_use` under `max_map_count` with kMapCountReserve to spare.
  static void check_map_count(const std::string& pattern, std::size_t files, std::size_t maps_in_use,
                              std::size_t max_map_count);

  // True when the first bytes of `path` are an llm.c shard header (magic 20240520 or 20240801).
  static bool has_llmc_magic(const std::string& path);

  const std::vector<Piece>& pieces() const { return pieces_; }
  std::size_t size() const override { return total_; }
  std::uint32_t token(std::size_t piece, std::size_t i) const;

  // Largest token id (a full pass, then cached). 0 for no tokens.
  std::uint32_t max_token() const;
  // Throws ds::Error naming the first token >= vocab_size: its file, byte offset and value;
  // `what` names the limit in the message ("model.vocab_size").
  void check_vocab(std::int64_t vocab_size, const std::string& what = "the vocab size") const;
  // The vocabulary the data implies when the model sets none: max_token() + 1, after
  // check_vocab against kMaxImpliedVocab (an error naming the file, byte offset and id).
  std::int64_t implied_vocab_size() const;

  // (train, validation): validation is the last `val_fraction` of the tokens (at least
  // min_val_tokens when val_fraction > 0), as TextDataset::split; a file cut by the split
  // gives windows on both sides of the cut, none across it.
  std::pair<TokenShards, TokenShards> split(double val_fraction, std::size_t min_val_tokens = 0) const;

  std::size_t num_samples(std::int64_t seq) const override;
  void sample(std::size_t index, std::int64_t seq, std::int32_t* inputs,
              std::int32_t* targets) const override;

  // Cheap identity of the data for comparing ranks: each piece's token count, width and its
  // first and last 4 KiB of tokens (not every byte: the data may be many GiB).
  std::uint64_t fingerprint() const;

  // The first `n` tokens of the stream (for a prompt).
  std::vector<std::int32_t> head(std::size_t n) const;

 private:
  void windows_for(std::int64_t seq) const;

  std::vector<Piece> pieces_;
  std::size_t total_ = 0;
  mutable std::int64_t max_token_ = -1;
  // Window prefix sums for the last seq asked: starts_[p] = first window index of piece p.
  // A cache (not thread-safe): readers of one object use it from one thread, with one seq.
  mutable std::int64_t seq_ = 0;
  mutable std::vector<std::size_t> starts_;
};

}  // namespace ds::data
