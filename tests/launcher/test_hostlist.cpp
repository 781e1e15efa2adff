// Slurm hostlist expansion and task counts (Slurm's hostlist syntax).
#include <gtest/gtest.h>

#include "ds/core/error.h"
#include "ds/launch/hostlist.h"
#include "ds/launch/range_list.h"

using ds::launch::expand_hostlist;
using ds::launch::parse_tasks_per_node;
using V = std::vector<std::string>;

TEST(Hostlist, SpecExample) {
  EXPECT_EQ(expand_hostlist("node[01-03,07],gpu5"),
            (V{"node01", "node02", "node03", "node07", "gpu5"}));
}

TEST(Hostlist, LiteralsOrderAndDuplicatesKept) {
  EXPECT_EQ(expand_hostlist("b,a,b"), (V{"b", "a", "b"}));
  EXPECT_EQ(expand_hostlist("10.0.0.7"), (V{"10.0.0.7"}));
  EXPECT_EQ(expand_hostlist("localhost"), (V{"localhost"}));
  EXPECT_EQ(expand_hostlist("a b\tc,,d"), (V{"a", "b", "c", "d"}));
  EXPECT_TRUE(expand_hostlist("").empty());
}

TEST(Hostlist, Padding) {
  EXPECT_EQ(expand_hostlist("n[1-10]"), (V{"n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8",
                                            "n9", "n10"}));
  EXPECT_EQ(expand_hostlist("n[08-11]"), (V{"n08", "n09", "n10", "n11"}));
  EXPECT_EQ(expand_hostlist("n[098-101]"), (V{"n098", "n099", "n100", "n101"}));
  EXPECT_EQ(expand_hostlist("n[7]"), (V{"n7"}));
}

TEST(Hostlist, CartesianProductEarlierGroupsSlowest) {
  EXPECT_EQ(expand_hostlist("rack[1-2]-node[01-02]"),
            (V{"rack1-node01", "rack1-node02", "rack2-node01", "rack2-node02"}));
  EXPECT_EQ(expand_hostlist("a[1-2],b[3,5]"), (V{"a1", "a2", "b3", "b5"}));
}

TEST(Hostlist, Errors) {
  for (const char* bad : {"n[4-2]", "n[a-c]", "n[]", "n[-1]", "n[1-2]-ib", "n[1-2", "n1]",
                          "n[1-]", "n[1,,2]", "n[[1]]"}) {
    EXPECT_THROW(expand_hostlist(bad), ds::Error) << bad;
  }
  try {
    expand_hostlist("x,node[4-2]");
    FAIL();
  } catch (const ds::Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("x,node[4-2]"), std::string::npos) << w;
    EXPECT_NE(w.find("4-2"), std::string::npos) << w;
  }
}

TEST(Hostlist, SizeLimits) {
  EXPECT_EQ(expand_hostlist("n[0-99999]").size(), 100000u);
  EXPECT_THROW(expand_hostlist("n[0-100000]"), ds::Error);
  EXPECT_THROW(expand_hostlist("a[0-999]b[0-999]"), ds::Error);  // 10^6 by product
  EXPECT_THROW(expand_hostlist("n[0-99999],m[0-1]"), ds::Error);
}

TEST(TasksPerNode, Forms) {
  EXPECT_EQ(parse_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(parse_tasks_per_node("4"), (std::vector<int>{4}));
  EXPECT_EQ(parse_tasks_per_node("1,2,3"), (std::vector<int>{1, 2, 3}));
  for (const char* bad : {"", "a", "2(x)", "2(3)", "2(x0)", "-1", "2,", "2(x3"}) {
    EXPECT_THROW(parse_tasks_per_node(bad), ds::Error) << bad;
  }
}

// The tokenizer that --bind_core_list and the hostlist brackets share.
TEST(RangeList, SplitsItemsAndEnds) {
  auto items = ds::launch::split_range_list("01-03,7,,4-");
  ASSERT_EQ(items.size(), 4u);
  EXPECT_EQ(items[0].text, "01-03");
  EXPECT_EQ(items[0].lo, "01");
  EXPECT_EQ(items[0].hi, "03");
  EXPECT_TRUE(items[0].is_range);
  EXPECT_EQ(items[1].lo, "7");
  EXPECT_EQ(items[1].hi, "7");
  EXPECT_FALSE(items[1].is_range);
  EXPECT_EQ(items[2].text, "");  // empty items reach the caller, which refuses them
  EXPECT_EQ(items[3].hi, "");
  EXPECT_TRUE(items[3].is_range);
  ASSERT_EQ(ds::launch::split_range_list("").size(), 1u);
  auto two_dashes = ds::launch::split_range_list("1-2-3");
  EXPECT_EQ(two_dashes[0].lo, "1");
  EXPECT_EQ(two_dashes[0].hi, "2-3");
}
