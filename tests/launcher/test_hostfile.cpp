// Hostfile grammar and dialects (DeepSpeed's launcher/runner.py and the Open MPI / Horovod forms).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include "../common/no_hang.h"
#include "ds/core/error.h"
#include "ds/launch/hostfile.h"

using namespace ds::launch;

namespace {
std::string error_of(const std::string& text) {
  try {
    parse_hostfile(text, "hf");
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}
void expect_pool(const std::string& text, const std::vector<std::pair<std::string, int>>& want) {
  Pool p = parse_hostfile(text, "hf");
  ASSERT_EQ(p.size(), want.size()) << text;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(p[i].host, want[i].first) << text;
    EXPECT_EQ(p[i].slots, want[i].second) << text;
  }
}
}  // namespace

TEST(Hostfile, DeepSpeedGrammar) {
  expect_pool("worker-0 slots=4\nworker-1 slots=2\n", {{"worker-0", 4}, {"worker-1", 2}});
  expect_pool("\n# comment\n  worker-1 slots=2  \n\n\tworker-0\tslots=4\r\n",
              {{"worker-1", 2}, {"worker-0", 4}});
  expect_pool("w slots=2 # trailing comment", {{"w", 2}});
  expect_pool("w slots=007", {{"w", 7}});
  expect_pool("w slots=0\nv slots=1", {{"w", 0}, {"v", 1}});
  expect_pool("10.0.0.7 slots=3", {{"10.0.0.7", 3}});
  expect_pool("no-newline-at-end slots=1", {{"no-newline-at-end", 1}});
}

TEST(Hostfile, OpenMpiAndHorovodForms) {
  expect_pool("a:4\nb:2", {{"a", 4}, {"b", 2}});
  expect_pool("a slots=4 max_slots=8", {{"a", 4}});
  expect_pool("a slots = 4", {{"a", 4}});
  expect_pool("a slots=4 max-slots=4\nb slots_max=9 slots=2\nc slots-max=3 cpu=1\nd count=5",
              {{"a", 4}, {"b", 2}, {"c", 1}, {"d", 5}});
  expect_pool("a:0", {{"a", 0}});
}

TEST(Hostfile, Errors) {
  struct Case {
    const char* text;
    const char* needle;
  };
  for (const Case& c : std::vector<Case>{
           {"", "empty"},
           {"# only\n\n", "empty"},
           {"a slots=1\n\nb\n", "hf:3: host 'b' has no slot count"},
           {"a slots=1\na slots=2\n", "hf:2: duplicate host 'a' (first on line 1)"},
           {"a:1\na slots=2\n", "duplicate host"},
           // DNS names are case-insensitive: one machine, listed twice.
           {"Worker-1 slots=2\nworker-1 slots=2\n",
            "hf:2: duplicate host 'worker-1' (first on line 1 as 'Worker-1'; host names are case-insensitive)"},
           {"node.EXAMPLE.com:1\nNODE.example.COM:1\n", "duplicate host"},
           {"a slots=-1", "bad slot count '-1'"},
           {"a slots=four", "bad slot count 'four'"},
           {"a slots=4abc", "bad slot count '4abc'"},
           {"a SLOTS=4", "unknown key 'SLOTS'"},
           {"a slots=4 max_slots=2", "max_slots=2 is less than slots=4"},
           {"a max_slots=2", "no slots=N"},
           {"a slots=1 slots=2", "given twice"},
           {"a:", "malformed"},
           {"a:x", "bad slot count 'x'"},
           {"a:1 b", "malformed"},
           {"a:-3", "bad slot count '-3'"},
           {"user@h slots=2", "invalid host name 'user@h'"},
           {"h;rm slots=2", "invalid host name"},
           {"-h slots=2", "invalid host name"},
           {"a slots=99999999999", "bad slot count"},
           {"=3", "malformed"},
           {"a slots", "malformed"},
           {"a slots=", "bad slot count ''"},
       }) {
    std::string e = error_of(c.text);
    EXPECT_NE(e.find(c.needle), std::string::npos) << "input: '" << c.text << "' error: '" << e << "'";
  }
}

TEST(Hostfile, ErrorsNameFileAndLine) {
  std::string e = error_of("a slots=1\n# c\nbad line here\n");
  EXPECT_NE(e.find("hf:3:"), std::string::npos) << e;
}

TEST(Hostfile, MissingFileIsAbsent) {
  Pool p;
  EXPECT_FALSE(read_hostfile("/nonexistent/dir/hostfile", p));
  EXPECT_TRUE(p.empty());
  EXPECT_THROW(read_hostfile("/", p), ds::Error);
}

// A hostfile that is a FIFO is refused at once (a blocking read would hang dsrun), a device
// or directory is named as what it is.
TEST(Hostfile, OnlyARegularFileIsRead) {
  std::string tmpl = (std::filesystem::temp_directory_path() / "ds_hostfile.XXXXXX").string();
  const std::string d = ::mkdtemp(tmpl.data());
  const std::string fifo = d + "/hostfile";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Pool p;
  std::string e = error_without_hang(fifo, [&] { read_hostfile(fifo, p); });
  EXPECT_NE(e.find("hostfile " + fifo + " is a FIFO, not a regular file"), std::string::npos) << e;
  e = error_without_hang(fifo, [&] { read_hostfile("/dev/zero", p); });
  EXPECT_NE(e.find("hostfile /dev/zero is a character device, not a regular file"), std::string::npos) << e;
  e = error_without_hang(fifo, [&] { read_hostfile(d, p); });
  EXPECT_NE(e.find("hostfile " + d + " is a directory, not a regular file"), std::string::npos) << e;
  std::filesystem::remove_all(d);
}

TEST(Hostfile, HostNames) {
  EXPECT_TRUE(valid_host_name("node-01.cluster_a"));
  EXPECT_FALSE(valid_host_name(""));
  EXPECT_FALSE(valid_host_name("a b"));
  EXPECT_FALSE(valid_host_name("a$(x)"));
  EXPECT_FALSE(valid_host_name("a:1"));
  EXPECT_FALSE(valid_host_name("-oProxy"));
}
