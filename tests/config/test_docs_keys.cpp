// The config reference names every key the parser accepts: each part of each key path in the
// parser's tables (config_keys()) is written in backticks in docs/user/config.md or in the pages
// that hold a section's keys (monitoring.md, pipeline.md), so that a key added without
// documentation fails here.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "schema.h"

namespace {

constexpr const char* kConfigPages[] = {"config.md", "monitoring.md", "pipeline.md"};

// The pages under DS_USER_DOCS_DIR one after the other; empty when one cannot be read.
std::string read_docs() {
  std::string text;
  for (const char* page : kConfigPages) {
    std::ifstream f(std::string(DS_USER_DOCS_DIR) + "/" + page);
    if (!f) return "";
    std::stringstream ss;
    ss << f.rdbuf();
    text += ss.str();
  }
  return text;
}

TEST(ConfigDocs, EveryParserKeyIsDocumented) {
  const std::string doc = read_docs();
  ASSERT_FALSE(doc.empty()) << "cannot read the config pages in " << DS_USER_DOCS_DIR;
  const auto keys = ds::config::config_keys();
  ASSERT_GT(keys.size(), 100u);
  auto has = [&](const std::string& text) { return doc.find(text) != std::string::npos; };
  // A part of a key path is named as `part`, as the start of a dotted name (`part.x`), or
  // with its section (`section.part`).
  auto documented = [&](const std::string& parent, const std::string& part) {
    if (has("`" + part + "`") || has("`" + part + ".")) return true;
    if (!parent.empty() && has("`" + parent + "." + part)) return true;
    // "the stage-3 keys ... and their names without the `stage3_` prefix"
    return has("`stage3_" + part + "`");
  };
  std::set<std::string> missing;
  for (const auto& path : keys) {
    std::size_t begin = 0;
    while (begin <= path.size()) {
      const std::size_t dot = path.find('.', begin);
      const std::string part = path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin);
      const std::string parent = begin == 0 ? "" : path.substr(0, begin - 1);
      const std::string last_parent = parent.substr(parent.rfind('.') == std::string::npos ? 0 : parent.rfind('.') + 1);
      if (!documented(parent, part) && !documented(last_parent, part)) missing.insert(path + " (`" + part + "`)");
      if (dot == std::string::npos) break;
      begin = dot + 1;
    }
  }
  for (const auto& m : missing) ADD_FAILURE() << "docs/user/{config,monitoring,pipeline}.md do not name " << m;
}

TEST(ConfigDocs, KeysIncludeEverySection) {
  const auto keys = ds::config::config_keys();
  const std::set<std::string> all(keys.begin(), keys.end());
  for (const char* k : {"train_batch_size", "fp16.loss_scale", "zero_optimization.stage", "checkpoint.io_threads",
                        "communication.shared_memory", "kernels.attention_block", "optimizer.params.betas",
                        "optimizer.params.initial_accumulator_value", "scheduler.params.cycle_min_lr",
                        "scheduler.params.lr_range_test_staircase", "zero_optimization.offload_optimizer.device"}) {
    EXPECT_TRUE(all.count(k)) << k;
  }
}

}  // namespace
