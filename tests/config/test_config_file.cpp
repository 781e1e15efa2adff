// The config file itself: only a regular file is read (a FIFO, directory or device is named
// as what it is, never waited on or read without end), a size cap, and a bounded number of
// unknown-key warnings.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../common/temp_dir.h"
#include "../common/no_hang.h"
#include "ds/config/parse.h"
#include "ds/core/error.h"

namespace fs = std::filesystem;
using namespace ds::config;

namespace {

TEST(ConfigFile, FifoIsRefusedNotWaitedOn) {
  TempDir d("ds_config_file");
  const std::string p = (d.path / "ds_config.json").string();
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  std::string e = error_without_hang(p, [&] { load_config_file(p); });
  EXPECT_HAS(e, "config file " + p + " is a FIFO, not a regular file");
  e = error_without_hang(p, [&] { load_config(p); });
  EXPECT_HAS(e, "config file " + p + " is a FIFO, not a regular file");
}

TEST(ConfigFile, DirectoryAndDeviceAreNamed) {
  TempDir d("ds_config_file");
  // load_config (DeepSpeed's path-or-JSON argument) said "no such file" for a directory
  EXPECT_HAS(error_of([&] { load_config(d.path.string()); }),
             "config file " + d.path.string() + " is a directory, not a regular file");
  EXPECT_HAS(error_of([&] { load_config_file(d.path.string()); }),
             "config file " + d.path.string() + " is a directory, not a regular file");
  EXPECT_HAS(error_of([] { load_config_file("/dev/zero"); }),
             "config file /dev/zero is a character device, not a regular file");
  EXPECT_HAS(error_of([] { load_config("/dev/null"); }), "config file /dev/null is a character device, not a regular file");
}

TEST(ConfigFile, SizeCapNamesTheFile) {
  TempDir d("ds_config_file");
  const std::string p = (d.path / "huge.json").string();
  {
    std::ofstream f(p);
    f << "{\"train_batch_size\": 8, \"pad\": \"" << std::string(kMaxConfigBytes, 'x') << "\"}";
  }
  const std::string size = std::to_string(fs::file_size(p));
  EXPECT_HAS(error_of([&] { load_config_file(p); }),
             "config file " + p + " is " + size + " bytes; the limit is 4194304 bytes (4 MiB)");
  EXPECT_HAS(error_of([&] { load_config(p); }), "config file " + p + " is " + size + " bytes");
  // text given directly is held to the same cap
  const std::string text = "{\"pad\": \"" + std::string(kMaxConfigBytes, 'x') + "\"}";
  EXPECT_HAS(error_of([&] { parse_config_text(text, "<json string>"); }),
             "config <json string> is " + std::to_string(text.size()) + " bytes; the limit is 4194304 bytes");
}

TEST(ConfigFile, UnknownTopLevelKeysAreWarnedAboutUpToALimit) {
  std::string text = "{\"train_batch_size\": 8";
  const int n = 5000;
  for (int i = 0; i < n; ++i) text += ", \"junk_key_" + std::to_string(i) + "\": " + std::to_string(i);
  text += "}";
  std::vector<std::string> warnings;
  EXPECT_EQ(parse_config_text(text, "ds.json", &warnings).train_batch_size, 8);
  ASSERT_EQ(warnings.size(), kMaxUnknownKeyWarnings + 1);
  EXPECT_HAS(warnings.front(), "ds.json:1:25: unknown top-level key \"junk_key_0\" is ignored");
  EXPECT_HAS(warnings[kMaxUnknownKeyWarnings - 1], "unknown top-level key \"junk_key_19\"");
  EXPECT_HAS(warnings.back(), "ds.json: ... and " + std::to_string(n - 20) +
                                  " more unknown top-level keys (ignored; only the first 20 are listed)");
  // at or under the limit: one warning each, no summary line
  warnings.clear();
  parse_config_text("{\"a_key\": 1, \"b_key\": 2}", "ds.json", &warnings);
  EXPECT_EQ(warnings.size(), 2u);
}

}  // namespace
