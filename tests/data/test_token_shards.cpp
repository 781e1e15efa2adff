// nanoGPT / llm.c token files: formats, globs, windows that stay inside one file, the errors
// (each naming the file and byte offset), the validation split, and exact resume across shards.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/data/sampler.h"
#include "ds/data/token_shards.h"
#include "shard_files.h"

namespace {

using ds::data::DistributedSampler;
using ds::data::TokenShards;

class TokenShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ds_shards_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  // The error TokenShards::open (then check_vocab, when vocab > 0) throws; "" when none.
  std::string error_of(const std::string& pattern, int raw_width = 2, std::int64_t vocab = 0) const {
    try {
      auto s = TokenShards::open(pattern, raw_width);
      if (vocab > 0) s.check_vocab(vocab);
    } catch (const ds::Error& e) {
      return e.what();
    }
    return "";
  }
  std::string dir_;
};

std::vector<std::uint32_t> iota_tokens(std::size_t n, std::uint32_t base) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = base + std::uint32_t(i);
  return t;
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

TEST_F(TokenShardsTest, NanoGptRawUint16File) {
  write_raw_tokens(path("train.bin"), iota_tokens(101, 50000));
  const auto s = TokenShards::open(path("train.bin"));
  ASSERT_EQ(s.size(), 101u);
  EXPECT_EQ(s.pieces().size(), 1u);
  EXPECT_EQ(s.max_token(), 50100u);
  EXPECT_EQ(s.num_samples(10), 10u);  // (101 - 1) / 10
  std::int32_t in[10], tg[10];
  s.sample(3, 10, in, tg);
  EXPECT_EQ(in[0], 50030);
  EXPECT_EQ(tg[9], 50040);
  EXPECT_THROW(s.sample(10, 10, in, tg), ds::Error);
}

TEST_F(TokenShardsTest, Uint32RawAndLlmcVersion2) {
  write_raw_tokens(path("big.u32"), iota_tokens(40, 100000), 4);
  auto raw = TokenShards::open(path("big.u32"), 4);
  EXPECT_EQ(raw.size(), 40u);
  EXPECT_EQ(raw.token(0, 39), 100039u);
  write_llmc_shard(path("v2.bin"), iota_tokens(40, 200000), 2);
  auto v2 = TokenShards::open(path("v2.bin"));
  EXPECT_EQ(v2.size(), 40u);
  EXPECT_EQ(v2.pieces()[0].width, 4);
  EXPECT_EQ(v2.max_token(), 200039u);
  EXPECT_TRUE(TokenShards::has_llmc_magic(path("v2.bin")));
  // llm.c's Llama 3 shards: magic 20240801, version 7, uint32 tokens; in one set with v1.
  write_llmc_shard(path("mix_0.bin"), iota_tokens(10, 5), 1);
  write_llmc_shard(path("mix_1.bin"), iota_tokens(10, 128000), 7, -1, 20240801);
  auto mix = TokenShards::open(path("mix_*.bin"));
  EXPECT_EQ(mix.size(), 20u);
  EXPECT_EQ(mix.pieces()[1].width, 4);
  EXPECT_EQ(mix.token(1, 9), 128009u);
  EXPECT_EQ(mix.token(0, 9), 14u);
  write_llmc_shard(path("l3v1.bin"), iota_tokens(10, 5), 1, -1, 20240801);
  EXPECT_HAS(error_of(path("l3v1.bin")), "unsupported version 1 at byte offset 4 (magic 20240801: 7 for uint32 tokens)");
  EXPECT_FALSE(TokenShards::has_llmc_magic(path("big.u32")));
}

// A glob is sorted by name, and no window spans two files: each shard's windows are its own.
TEST_F(TokenShardsTest, GlobIsSortedAndWindowsStayInOneShard) {
  write_llmc_shard(path("train_000002.bin"), iota_tokens(35, 2000));
  write_llmc_shard(path("train_000000.bin"), iota_tokens(23, 0));
  write_llmc_shard(path("train_000001.bin"), iota_tokens(5, 1000));  // fills no window of 8+1
  write_raw_tokens(path("val_000000.bin"), iota_tokens(9, 7));        // not matched
  const auto s = TokenShards::open(path("train_*.bin"));
  ASSERT_EQ(s.pieces().size(), 3u);
  EXPECT_EQ(s.pieces()[0].path, path("train_000000.bin"));
  EXPECT_EQ(s.pieces()[2].path, path("train_000002.bin"));
  EXPECT_EQ(s.size(), 63u);
  const std::int64_t T = 8;
  ASSERT_EQ(s.num_samples(T), 2u + 0u + 4u);  // 22/8, 4/8, 34/8
  std::vector<std::int32_t> firsts;
  for (std::size_t i = 0; i < s.num_samples(T); ++i) {
    std::int32_t in[8], tg[8];
    s.sample(i, T, in, tg);
    firsts.push_back(in[0]);
    for (int k = 0; k < 8; ++k) {
      EXPECT_EQ(tg[k], in[k] + 1) << "window " << i << " straddles a shard boundary";
      EXPECT_EQ(in[k] / 1000, in[0] / 1000) << "window " << i;
    }
  }
  EXPECT_EQ(firsts, (std::vector<std::int32_t>{0, 8, 2000, 2008, 2016, 2024}));
}

TEST_F(TokenShardsTest, ErrorsNameTheFileAndByteOffset) {
  // A glob that matches nothing.
  EXPECT_HAS(error_of(path("nothing_*.bin")), "token data '" + path("nothing_*.bin") + "': the pattern matches no file");
  EXPECT_HAS(error_of(path("missing.bin")), path("missing.bin") + " does not exist");

  // Wrong magic in the second shard of an llm.c set.
  write_llmc_shard(path("a_0.bin"), iota_tokens(20, 0));
  write_llmc_shard(path("a_1.bin"), iota_tokens(20, 0), 1, -1, 20240326);
  EXPECT_HAS(error_of(path("a_*.bin")), "token file '" + path("a_1.bin") +
                                            "': wrong magic 20240326 at byte offset 0, expected 20240520 or 20240801");
  // A raw file in front of llm.c shards: mixed.
  write_raw_tokens(path("m_0.bin"), iota_tokens(20, 0));
  write_llmc_shard(path("m_1.bin"), iota_tokens(20, 0));
  EXPECT_HAS(error_of(path("m_*.bin")), "token file '" + path("m_1.bin") + "': starts with the llm.c magic");

  // Unsupported version.
  write_llmc_shard(path("v3.bin"), iota_tokens(20, 0), 3);
  EXPECT_HAS(error_of(path("v3.bin")), "token file '" + path("v3.bin") + "': unsupported version 3 at byte offset 4");

  // Truncated: the header says 20 tokens (1064 bytes), the file has 19.
  write_llmc_shard(path("trunc.bin"), iota_tokens(19, 0), 1, 20);
  EXPECT_HAS(error_of(path("trunc.bin")), "token file '" + path("trunc.bin") +
                                              "': truncated: the header's token count 20 (byte offset 8) needs 1064 "
                                              "bytes, the file ends at byte offset 1062");
  std::filesystem::resize_file(path("trunc.bin"), 600);
  EXPECT_HAS(error_of(path("trunc.bin")), "truncated llm.c shard: 600 bytes");
  // More tokens than the header says.
  write_llmc_shard(path("long.bin"), iota_tokens(21, 0), 1, 20);
  EXPECT_HAS(error_of(path("long.bin")), "token file '" + path("long.bin") +
                                             "': 2 bytes after the last token at byte offset 1064");

  // Odd-sized raw file (uint16: 21 bytes; uint32: 22 bytes).
  { std::ofstream f(path("odd.bin"), std::ios::binary); f << std::string(21, 'x'); }
  EXPECT_HAS(error_of(path("odd.bin")), "token file '" + path("odd.bin") +
                                            "': odd-sized raw file: 21 bytes is not a whole number of 2-byte tokens "
                                            "(1 stray byte(s) at byte offset 20)");
  { std::ofstream f(path("odd4.bin"), std::ios::binary); f << std::string(22, 'x'); }
  EXPECT_HAS(error_of(path("odd4.bin"), 4), "(2 stray byte(s) at byte offset 20)");
  { std::ofstream f(path("empty.bin"), std::ios::binary); }
  EXPECT_HAS(error_of(path("empty.bin")), "token file '" + path("empty.bin") + "' is empty");

  // A token id >= the vocabulary: the file and the token's byte offset (raw: 2 * index;
  // llm.c: 1024 + 2 * index).
  auto t = iota_tokens(30, 0);
  t[17] = 300;
  write_raw_tokens(path("raw_vocab.bin"), t);
  EXPECT_HAS(error_of(path("raw_vocab.bin"), 2, 256),
             "token file '" + path("raw_vocab.bin") + "': token id 300 at byte offset 34 is >= the vocab size 256");
  write_llmc_shard(path("vocab_0.bin"), iota_tokens(30, 0));
  write_llmc_shard(path("vocab_1.bin"), t);
  EXPECT_HAS(error_of(path("vocab_*.bin"), 2, 256),
             "token file '" + path("vocab_1.bin") + "': token id 300 at byte offset 1058 is >= the vocab size 256");
  EXPECT_EQ(error_of(path("vocab_*.bin"), 2, 301), "");
}

TEST_F(TokenShardsTest, ValidationSplitIsTheTailWithoutCrossWindows) {
  write_llmc_shard(path("s_0.bin"), iota_tokens(50, 0));
  write_llmc_shard(path("s_1.bin"), iota_tokens(50, 1000));
  const auto all = TokenShards::open(path("s_*.bin"));
  auto [train, val] = all.split(0.3);  // 30 tokens: the tail of s_1
  EXPECT_EQ(train.size(), 70u);
  EXPECT_EQ(val.size(), 30u);
  ASSERT_EQ(val.pieces().size(), 1u);
  EXPECT_EQ(val.token(0, 0), 1020u);
  EXPECT_EQ(val.head(2), (std::vector<std::int32_t>{1020, 1021}));
  EXPECT_EQ(train.num_samples(9), 5u + 2u);  // 49/9 and 19/9
  EXPECT_EQ(val.num_samples(9), 3u);         // 29/9
  std::int32_t in[9], tg[9];
  train.sample(6, 9, in, tg);
  EXPECT_EQ(in[0], 1009);
  EXPECT_EQ(tg[8], 1018);  // the last window of s_1's training part ends before the cut (1020)
  EXPECT_THROW(all.split(1.0), ds::Error);
  // The maps outlive the object they came from.
  TokenShards copy = val;
  EXPECT_EQ(copy.token(0, 29), 1049u);
}

// N micro-batches straight = k, then a new loader restored from the sampler state, then N - k:
// the same windows, across shard boundaries and an epoch boundary.
TEST_F(TokenShardsTest, ResumeIsExactAcrossShards) {
  for (int f = 0; f < 4; ++f) write_llmc_shard(path("r_" + std::to_string(f) + ".bin"), iota_tokens(37 + 11 * f, 1000 * f));
  const auto data = TokenShards::open(path("r_*.bin"));
  const std::int64_t T = 4;
  const std::size_t n = data.num_samples(T);
  auto windows = [&](ds::data::Loader& l, int steps) {
    std::vector<std::int32_t> out;
    for (int i = 0; i < steps; ++i) {
      ds::Batch b = l.next();
      out.insert(out.end(), b.inputs.begin(), b.inputs.end());
      out.insert(out.end(), b.targets.begin(), b.targets.end());
    }
    return out;
  };
  for (bool drop : {false, true}) {
    ds::data::Loader straight(data, T, DistributedSampler(n, 2, 1, 3, true, 9, drop));
    const auto want = windows(straight, 20);  // > one epoch
    ds::data::Loader first(data, T, DistributedSampler(n, 2, 1, 3, true, 9, drop));
    auto got = windows(first, 7);
    const auto state = first.sampler().state();
    ds::data::Loader resumed(data, T, DistributedSampler(n, 2, 1, 3, true, 9, drop));
    resumed.sampler().set_state(state);
    const auto rest = windows(resumed, 13);
    got.insert(got.end(), rest.begin(), rest.end());
    EXPECT_EQ(got, want) << "drop_last " << drop;
  }
}

// Without model.vocab_size the data sizes the model: a corrupt id of 4e9 is an error naming
// its file, byte offset and value, not a 1 TB allocation.
TEST_F(TokenShardsTest, ImpliedVocabIsBounded) {
  write_llmc_shard(path("ok.bin"), {1, 2, 70000}, 2);
  EXPECT_EQ(TokenShards::open(path("ok.bin")).implied_vocab_size(), 70001);
  write_llmc_shard(path("bad.bin"), {1, 2, 4000000000u, 5}, 2);
  const auto s = TokenShards::open(path("bad.bin"));
  std::string e;
  try {
    (void)s.implied_vocab_size();
  } catch (const ds::Error& err) {
    e = err.what();
  }
  EXPECT_HAS(e, "token file '" + path("bad.bin") + "': token id 4000000000 at byte offset 1032 is >= the largest "
                "vocab size taken from the data (set model.vocab_size for more): 2097152");
}

// More files than memory maps: the count and the limit, not mmap's "Cannot allocate memory"
// (the check itself: 66,000 real files would make a slow test).
TEST_F(TokenShardsTest, MapCountLimitIsNamed) {
  EXPECT_NO_THROW(TokenShards::check_map_count("p_*.bin", 60000, 400, 65530));
  std::string e;
  try {
    TokenShards::check_map_count("p_*.bin", 66000, 400, 65530);
  } catch (const ds::Error& err) {
    e = err.what();
  }
  EXPECT_HAS(e, "token data 'p_*.bin': 66000 files need 66000 memory maps (one each), but the process may hold 65530 "
                "(/proc/sys/vm/max_map_count) and holds 400 already, with 1024 kept free");
  // open() reads the real limit and count: a small set passes.
  write_llmc_shard(path("m_0.bin"), {1, 2});
  EXPECT_EQ(error_of(path("m_*.bin")), "");
}

// A glob through a symlink loop says so instead of "matches no file".
TEST_F(TokenShardsTest, SymlinkLoopIsNamed) {
  std::filesystem::create_directory_symlink(path("loop"), path("loop"));
  EXPECT_HAS(error_of(path("loop/*.bin")), "token data '" + path("loop/*.bin") + "': cannot ");
  EXPECT_HAS(error_of(path("loop/*.bin")), "'" + path("loop") + "': Too many levels of symbolic links (a symbolic link loop)");
  EXPECT_HAS(error_of(path("loop/sub/*.bin")), "Too many levels of symbolic links (a symbolic link loop)");
  EXPECT_HAS(error_of(path("loop/a.bin")), "Too many levels of symbolic links");
  EXPECT_HAS(error_of(path("none/*.bin")), "the pattern matches no file");
}

}  // namespace
