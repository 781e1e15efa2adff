// ds::TextLines: the line splitting and numbering the hostfile, environment-file and merges.txt
// parsers share, and the "<file>:<line>: " prefix of their errors.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/text_lines.h"

namespace {

std::vector<std::pair<int, std::string>> all(std::string_view text) {
  ds::TextLines lines(text, "f.txt");
  std::vector<std::pair<int, std::string>> out;
  while (lines.next()) out.emplace_back(lines.number(), std::string(lines.line()));
  return out;
}

using Lines = std::vector<std::pair<int, std::string>>;

}  // namespace

TEST(TextLines, SplitsAndNumbers) {
  EXPECT_EQ(all(""), Lines{});
  EXPECT_EQ(all("a"), (Lines{{1, "a"}}));
  EXPECT_EQ(all("a\n"), (Lines{{1, "a"}}));  // no empty line after the last '\n'
  EXPECT_EQ(all("a\n\nb"), (Lines{{1, "a"}, {2, ""}, {3, "b"}}));
  EXPECT_EQ(all("\n"), (Lines{{1, ""}}));
  EXPECT_EQ(all("a\n\n"), (Lines{{1, "a"}, {2, ""}}));
}

TEST(TextLines, DropsOneCarriageReturn) {
  EXPECT_EQ(all("a\r\nb\r\n"), (Lines{{1, "a"}, {2, "b"}}));
  EXPECT_EQ(all("a\r\r\n\r"), (Lines{{1, "a\r"}, {2, ""}}));
  EXPECT_EQ(all("a\rb"), (Lines{{1, "a\rb"}}));  // only at the end
}

TEST(TextLines, KeepsOtherBytes) {
  const std::string text("x\0y\n \t z \n", 10);
  EXPECT_EQ(all(text), (Lines{{1, std::string("x\0y", 3)}, {2, " \t z "}}));
}

TEST(TextLines, WhereNamesFileAndLine) {
  ds::TextLines lines("ok\nbad\n", "dir/hostfile");
  EXPECT_EQ(lines.number(), 0);
  ASSERT_TRUE(lines.next());
  EXPECT_EQ(lines.where(), "dir/hostfile:1: ");
  ASSERT_TRUE(lines.next());
  EXPECT_EQ(lines.source(), "dir/hostfile");
  try {
    DS_CHECK(lines.line() == "ok", lines.where() << "expected 'ok', got '" << lines.line() << "'");
    FAIL() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("dir/hostfile:2: expected 'ok', got 'bad'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(lines.next());
  EXPECT_FALSE(lines.next());
}
