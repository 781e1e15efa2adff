// read_regular_file / open_regular_file / check_regular_file: only regular files are read,
// a FIFO is reported at once (never waited on), devices and directories are named as what
// they are, and the size cap holds.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "../common/temp_dir.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"

namespace fs = std::filesystem;
using namespace ds;

TEST(FileRead, ReadsARegularFile) {
  TempDir d("ds_file_read");
  const std::string p = (d.path / "a.json").string();
  std::ofstream(p) << "{\"x\": 1}\n";
  EXPECT_EQ(read_regular_file(p, "config file"), "{\"x\": 1}\n");
  EXPECT_TRUE(check_regular_file(p, "config file"));
  std::ofstream(d.path / "empty");
  EXPECT_EQ(read_regular_file((d.path / "empty").string(), "config file"), "");
}

TEST(FileRead, FifoIsReportedNotWaitedOn) {
  TempDir d("ds_file_read");
  const std::string p = (d.path / "fifo").string();
  ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  // Without a writer, a blocking open would never return; the test would time out.
  std::string e = error_of([&] { read_regular_file(p, "config file"); });
  EXPECT_NE(e.find("config file " + p + " is a FIFO, not a regular file"), std::string::npos) << e;
  e = error_of([&] { check_regular_file(p, "shard"); });
  EXPECT_NE(e.find("shard " + p + " is a FIFO, not a regular file"), std::string::npos) << e;
}

TEST(FileRead, DevicesAndDirectoriesAreNamed) {
  std::string e = error_of([] { read_regular_file("/dev/zero", "env file"); });
  EXPECT_NE(e.find("env file /dev/zero is a character device, not a regular file"), std::string::npos) << e;
  TempDir d("ds_file_read");
  e = error_of([&] { read_regular_file(d.path.string(), "manifest"); });
  EXPECT_NE(e.find("manifest " + d.path.string() + " is a directory, not a regular file"), std::string::npos) << e;
  // through a symlink: what it points at counts
  fs::create_symlink("/dev/null", d.path / "link");
  e = error_of([&] { check_regular_file((d.path / "link").string(), "latest"); });
  EXPECT_NE(e.find("is a character device"), std::string::npos) << e;
}

TEST(FileRead, MissingFile) {
  TempDir d("ds_file_read");
  const std::string p = (d.path / "nope").string();
  EXPECT_FALSE(check_regular_file(p, "env file", /*missing_ok=*/true));
  std::string e = error_of([&] { check_regular_file(p, "env file"); });
  EXPECT_NE(e.find("env file " + p + " does not exist"), std::string::npos) << e;
  e = error_of([&] { read_regular_file(p, "config file"); });
  EXPECT_NE(e.find("cannot open config file " + p + ": No such file or directory"), std::string::npos) << e;
}

TEST(FileRead, SizeCapNamesSizeAndLimit) {
  TempDir d("ds_file_read");
  const std::string p = (d.path / "big").string();
  std::ofstream(p) << std::string(5000, 'x');
  std::string e = error_of([&] { read_regular_file(p, "config file", 4096); });
  EXPECT_NE(e.find("config file " + p + " is 5000 bytes; the limit is 4096 bytes"), std::string::npos) << e;
  EXPECT_EQ(read_regular_file(p, "config file", 5000).size(), 5000u);
  ::truncate(p.c_str(), std::int64_t(kMaxControlFileBytes) + 1);
  e = error_of([&] { read_regular_file(p, "config file"); });
  EXPECT_NE(e.find("is 4194305 bytes; the limit is 4194304 bytes (4 MiB)"), std::string::npos) << e;
}

TEST(FileRead, NoCapReadsEverything) {
  TempDir d("ds_file_read");
  const std::string p = (d.path / "data").string();
  const std::string text(200000, 'y');
  std::ofstream(p) << text;
  EXPECT_EQ(read_regular_file(p, "data file", UINT64_MAX), text);
}

// A large file (an 80 MB vocab.json) is held once: the end of file is found without growing
// the string past the file's size.
TEST(FileRead, HoldsTheFileOnce) {
  TempDir d("ds_file_read_once");
  const std::string p = (d.path / "big").string();
  const std::string text(std::size_t(1) << 20, 'x');
  std::ofstream(p, std::ios::binary) << text;
  const std::string read = read_regular_file(p, "data file", UINT64_MAX);
  EXPECT_EQ(read, text);
  EXPECT_LT(read.capacity(), text.size() + 4096);
}

TEST(FileRead, OpenRegularFileIsBlockingAndReadable) {
  TempDir d("ds_file_read");
  const std::string p = (d.path / "f").string();
  std::ofstream(p) << "abc";
  const int fd = open_regular_file(p, "shard");
  char buf[4] = {};
  EXPECT_EQ(::read(fd, buf, 3), 3);
  EXPECT_EQ(std::string(buf), "abc");
  ::close(fd);
}
