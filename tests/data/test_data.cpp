// Datasets, token files, the distributed sampler and the loader.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "../common/no_hang.h"
#include "ds/core/error.h"
#include "ds/data/dataset.h"
#include "ds/data/sampler.h"

namespace {

using ds::data::DistributedSampler;
using ds::data::TextDataset;

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("ds_data_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

TEST(Data, EmbeddedCorpusIsRealByteLevelText) {
  auto c = ds::data::embedded_corpus();
  EXPECT_GT(c.size(), 200000u);
  EXPECT_NE(c.find("GNU GENERAL PUBLIC LICENSE"), std::string_view::npos);
  auto d = TextDataset::embedded();
  EXPECT_EQ(d.size(), c.size());
  EXPECT_EQ(d.vocab_size(), 256);
  for (std::size_t i = 0; i < d.size(); ++i) {
    ASSERT_LT(d.tokens()[i], 256);
    ASSERT_EQ(d.tokens()[i], static_cast<unsigned char>(c[i]));
  }
}

TEST(Data, TextFileAndMissingFile) {
  const std::string p = tmp_path("text.txt");
  { std::ofstream f(p, std::ios::binary); f << "hello\nworld"; }
  auto d = TextDataset::from_file(p);
  ASSERT_EQ(d.size(), 11u);
  EXPECT_EQ(d.tokens()[0], 'h');
  std::remove(p.c_str());
  try {
    TextDataset::from_file("/nonexistent/dir/corpus.txt");
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/corpus.txt"), std::string::npos) << e.what();
  }
  { std::ofstream f(p, std::ios::binary); }
  EXPECT_THROW(TextDataset::from_file(p), ds::Error);  // empty
  std::remove(p.c_str());
}

// A data file that is a FIFO is refused at once (never waited on), a device such as
// /dev/zero (which never ends) or a directory is named as what it is.
TEST(Data, OnlyRegularDataFilesAreRead) {
  const std::string fifo = tmp_path("fifo.txt");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  std::string e = error_without_hang(fifo, [&] { TextDataset::from_file(fifo); });
  EXPECT_NE(e.find("data file " + fifo + " is a FIFO, not a regular file"), std::string::npos) << e;
  e = error_without_hang(fifo, [&] { TextDataset::from_token_file(fifo); });
  EXPECT_NE(e.find("token file " + fifo + " is a FIFO, not a regular file"), std::string::npos) << e;
  std::remove(fifo.c_str());
  e = error_without_hang(fifo, [] { TextDataset::from_file("/dev/zero"); });
  EXPECT_NE(e.find("data file /dev/zero is a character device, not a regular file"), std::string::npos) << e;
  const std::string dir = tmp_path("dir");
  std::filesystem::create_directory(dir);
  e = error_without_hang(fifo, [&] { TextDataset::from_file(dir); });
  EXPECT_NE(e.find("data file " + dir + " is a directory, not a regular file"), std::string::npos) << e;
  std::filesystem::remove(dir);
}

TEST(Data, TokenFileRoundTrip) {
  for (std::uint16_t top : {std::uint16_t(255), std::uint16_t(50256)}) {
    std::vector<std::uint16_t> t = {0, 1, 2, top, 7, 7};
    const std::string p = tmp_path("tok.bin");
    ds::data::write_token_file(p, t, top == 255 ? 256u : 50257u);
    EXPECT_EQ(std::filesystem::file_size(p), 32u + t.size() * (top < 256 ? 1 : 2));
    auto d = TextDataset::from_token_file(p);
    EXPECT_EQ(std::vector<std::uint16_t>(d.tokens().begin(), d.tokens().end()), t);
    EXPECT_EQ(d.vocab_size(), top == 255 ? 256 : 50257);
    // Truncated payload: clear error naming the file.
    std::filesystem::resize_file(p, 33);
    try {
      TextDataset::from_token_file(p);
      FAIL() << "no error";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos);
    }
    std::remove(p.c_str());
  }
  EXPECT_THROW(TextDataset::from_token_file("/nonexistent.bin"), ds::Error);
  {
    // A header claiming a vocabulary that 16-bit tokens cannot have (2^31): rejected by name
    // before anything is sized from it; 65536 itself is the largest accepted.
    const std::string p = tmp_path("bigvocab.bin");
    const std::vector<std::uint16_t> t3{1, 2, 3};
    ds::data::write_token_file(p, t3, 65536u);
    EXPECT_EQ(TextDataset::from_token_file(p).vocab_size(), 65536);
    ds::data::write_token_file(p, t3, 1u << 31);
    try {
      TextDataset::from_token_file(p);
      FAIL() << "no error";
    } catch (const ds::Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find(p), std::string::npos) << w;
      EXPECT_NE(w.find("vocab size 2147483648"), std::string::npos) << w;
    }
    std::remove(p.c_str());
  }
  const std::string p = tmp_path("notok.bin");
  { std::ofstream f(p, std::ios::binary); f << "this is plain text, not a token file at all"; }
  EXPECT_THROW(TextDataset::from_token_file(p), ds::Error);
  std::remove(p.c_str());
}

TEST(Data, ValidationSplitIsTheTail) {
  auto d = TextDataset::from_bytes("abcdefghijklmnopqrst");  // 20 tokens
  auto [train, val] = d.split(0.1);
  EXPECT_EQ(train.size(), 18u);
  EXPECT_EQ(val.size(), 2u);
  EXPECT_EQ(val.tokens()[0], 's');
  auto [t2, v2] = d.split(0.05, 4);
  EXPECT_EQ(v2.size(), 4u);
  EXPECT_THROW(d.split(1.0), ds::Error);
}

TEST(Data, SamplesAreShiftedWindows) {
  auto d = TextDataset::from_bytes("0123456789");
  EXPECT_EQ(d.num_samples(3), 3u);  // windows of 4: 0123, 3456, 6789
  std::int32_t in[3], tg[3];
  d.sample(2, 3, in, tg);
  EXPECT_EQ(in[0], '6');
  EXPECT_EQ(tg[2], '9');
  EXPECT_THROW(d.sample(3, 3, in, tg), ds::Error);
}

TEST(Sampler, DisjointShardsCoverTheDatasetWithDropLast) {
  const std::size_t n = 103;
  for (int W : {1, 2, 4}) {
    std::multiset<std::size_t> all;
    for (int r = 0; r < W; ++r) {
      DistributedSampler s(n, W, r, 5, true, 9, true);
      auto idx = s.epoch_indices(0);
      EXPECT_EQ(idx.size(), n / std::size_t(W));
      EXPECT_EQ(s.steps_per_epoch(), (n / std::size_t(W)) / 5);
      all.insert(idx.begin(), idx.end());
    }
    EXPECT_EQ(std::set<std::size_t>(all.begin(), all.end()).size(), all.size()) << "overlap W=" << W;
    EXPECT_EQ(all.size(), n - n % std::size_t(W));
  }
}

TEST(Sampler, NoDropLastPadsAndYieldsPartialBatch) {
  const std::size_t n = 103;
  const int W = 4;
  std::multiset<std::size_t> all;
  for (int r = 0; r < W; ++r) {
    DistributedSampler s(n, W, r, 5, true, 9, false);
    EXPECT_EQ(s.samples_per_rank(), 26u);
    EXPECT_EQ(s.steps_per_epoch(), 6u);  // 5 full batches + one of 1
    std::size_t seen = 0;
    for (std::size_t k = 0; k < s.steps_per_epoch(); ++k) {
      auto b = s.next();
      EXPECT_EQ(b.size(), k + 1 < s.steps_per_epoch() ? 5u : 1u);
      all.insert(b.begin(), b.end());
      seen += b.size();
    }
    EXPECT_EQ(seen, 26u);
    EXPECT_EQ(s.state().epoch, 0u);
    s.next();
    EXPECT_EQ(s.state().epoch, 1u);
  }
  EXPECT_EQ(all.size(), 104u);
  EXPECT_EQ(std::set<std::size_t>(all.begin(), all.end()).size(), n);  // all covered, 1 repeat
}

TEST(Sampler, DeterministicPerSeedAndEpoch) {
  DistributedSampler a(50, 2, 1, 4, true, 3, false), b(50, 2, 1, 4, true, 3, false), c(50, 2, 1, 4, true, 4, false);
  EXPECT_EQ(a.epoch_indices(0), b.epoch_indices(0));
  EXPECT_NE(a.epoch_indices(0), a.epoch_indices(1));
  EXPECT_NE(a.epoch_indices(0), c.epoch_indices(0));
  DistributedSampler ordered(10, 1, 0, 4, false, 3, false);
  EXPECT_EQ(ordered.epoch_indices(5), (std::vector<std::size_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
}

TEST(Sampler, ResumeAtStepEqualsContinuing) {
  for (bool drop : {false, true}) {
    DistributedSampler run(37, 2, 1, 4, true, 5, drop);
    const std::uint64_t k = 7;  // crosses an epoch boundary (5 or 4 steps per epoch)
    for (std::uint64_t i = 0; i < k; ++i) run.next();
    DistributedSampler resumed(37, 2, 1, 4, true, 5, drop);
    resumed.skip_to_step(k);
    DistributedSampler restored(37, 2, 1, 4, true, 5, drop);
    restored.set_state(run.state());
    for (int i = 0; i < 12; ++i) {
      auto a = run.next();
      std::vector<std::size_t> va(a.begin(), a.end());
      auto b = resumed.next();
      auto c = restored.next();
      EXPECT_EQ(va, std::vector<std::size_t>(b.begin(), b.end())) << "step " << i;
      EXPECT_EQ(va, std::vector<std::size_t>(c.begin(), c.end())) << "step " << i;
    }
  }
  EXPECT_THROW(DistributedSampler(3, 4, 0, 2, true, 0, true), ds::Error);  // no full batch
  EXPECT_THROW(DistributedSampler(30, 2, 2, 2), ds::Error);                 // bad rank
}

TEST(Loader, BatchesMatchTheDatasetWindows) {
  auto d = TextDataset::embedded();
  const std::int64_t T = 16;
  ds::data::Loader loader(d, T, DistributedSampler(d.num_samples(T), 2, 0, 3, true, 1, true));
  DistributedSampler shadow(d.num_samples(T), 2, 0, 3, true, 1, true);
  for (int s = 0; s < 3; ++s) {
    ds::Batch b = loader.next();
    auto idx = shadow.next();
    ASSERT_EQ(b.batch, 3);
    ASSERT_EQ(b.seq, T);
    ASSERT_EQ(b.inputs.size(), std::size_t(3 * T));
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t t = 0; t < T; ++t) {
        EXPECT_EQ(b.inputs[i * T + t], d.tokens()[idx[i] * T + t]);
        EXPECT_EQ(b.targets[i * T + t], d.tokens()[idx[i] * T + t + 1]);
      }
  }
  std::vector<std::int32_t> in(3 * T), tg(3 * T);
  ds::Batch b = loader.next(in, tg);
  EXPECT_EQ(b.inputs.data(), in.data());
  std::vector<std::int32_t> small(T);
  EXPECT_THROW(loader.next(small, small), ds::Error);
}

}  // namespace
