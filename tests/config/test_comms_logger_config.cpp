// comms_logger: DeepSpeed's keys and defaults, read instead of warned about; a bad value names
// its key and position.
#include "parse_test_util.h"

namespace {

using config_test::error_of;
using config_test::parse;

TEST(ConfigCommsLogger, DefaultsAsDeepSpeed) {
  const auto d = parse("{}");
  EXPECT_FALSE(d.comms_logger.enabled);
  EXPECT_FALSE(d.comms_logger.verbose);
  EXPECT_TRUE(d.comms_logger.prof_all);
  EXPECT_TRUE(d.comms_logger.prof_ops.empty());
  EXPECT_FALSE(d.comms_logger.debug);
}

TEST(ConfigCommsLogger, EveryKeyIsRead) {
  std::vector<std::string> w;
  const auto c = parse(R"({"comms_logger": {"enabled": true, "verbose": true, "prof_all": false,
                           "prof_ops": ["all_reduce", "all_gather"], "debug": true}})", &w);
  EXPECT_TRUE(w.empty()) << w.front();  // implemented: no "does not implement it" warning
  EXPECT_TRUE(c.comms_logger.enabled);
  EXPECT_TRUE(c.comms_logger.verbose);
  EXPECT_FALSE(c.comms_logger.prof_all);
  EXPECT_EQ(c.comms_logger.prof_ops, (std::vector<std::string>{"all_reduce", "all_gather"}));
  EXPECT_TRUE(c.comms_logger.debug);
  EXPECT_TRUE(parse(R"({"comms_logger": {"prof_ops": null}})").comms_logger.prof_ops.empty());
}

TEST(ConfigCommsLogger, BadValuesNameTheKey) {
  EXPECT_HAS(error_of(R"({"comms_logger": {"verbose": 1}})"), "ds.json:1:19: comms_logger.verbose: expected true or false");
  EXPECT_HAS(error_of(R"({"comms_logger": {"prof_all": "yes"}})"), "comms_logger.prof_all: expected true or false");
  EXPECT_HAS(error_of(R"({"comms_logger": {"prof_ops": "all_reduce"}})"),
             "comms_logger.prof_ops: expected a list of collective names such as [\"all_reduce\", \"all_gather\"], got");
  EXPECT_HAS(error_of(R"({"comms_logger": {"prof_ops": ["all_reduce", 3]}})"), "comms_logger.prof_ops: expected a list");
  EXPECT_HAS(error_of(R"({"comms_logger": {"debug": null}})"), "comms_logger.debug: expected true or false");
  EXPECT_HAS(error_of(R"({"comms_logger": {"prof_op": []}})"), "unknown key in comms_logger (did you mean \"prof_ops\"?)");
  EXPECT_HAS(error_of(R"({"comms_logger": true})"), "comms_logger: expected an object");
}

// comms_config (which DeepSpeed ignores) written with the logger's keys: the warning says where
// they go.
TEST(ConfigCommsLogger, LoggerKeysUnderCommsConfigPointToTheSection) {
  std::vector<std::string> w;
  parse(R"({"comms_config": {"verbose": true, "zzz": 1}})", &w);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_HAS(w[0], "comms_config.verbose is ignored (DeepSpeed ignores comms_config; dstrain's communication "
                   "settings are in \"communication\"; the communication logger's keys go in \"comms_logger\")");
  EXPECT_HAS(w[1], "comms_config.zzz is ignored");
  EXPECT_EQ(w[1].find("comms_logger"), std::string::npos) << w[1];
}

}  // namespace
