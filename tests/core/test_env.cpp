// The environment registry: typed getters parse strictly and name the variable on error,
// defaults come from the table, unregistered DS_* names are refused.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>

#include "../common/temp_dir.h"
#include "ds/core/env.h"

namespace env = ds::env;

namespace {
// Sets a variable for one test and restores its previous state.
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(const char* n, const char* v) : name(n) {
    if (const char* o = ::getenv(n)) old = o;
    ::setenv(n, v, 1);
  }
  ~ScopedEnv() {
    if (old) ::setenv(name.c_str(), old->c_str(), 1);
    else ::unsetenv(name.c_str());
  }
};
}  // namespace

TEST(Env, TableRowsAreWellFormedAndUnique) {
  std::set<std::string> names;
  for (const env::Var& v : env::table()) {
    EXPECT_TRUE(names.insert(v.name).second) << v.name << " twice";
    EXPECT_EQ(std::string(v.name).rfind("DS_", 0), 0u) << v.name;
    EXPECT_TRUE(v.help && *v.help) << v.name;
    if (v.type == env::Type::Choice) { EXPECT_TRUE(v.choices && *v.choices) << v.name; }
    if (v.type == env::Type::Int) { EXPECT_LT(v.min, v.max) << v.name; }
  }
  EXPECT_GE(names.size(), 2u);
}

TEST(Env, DefaultsWhenUnset) {
  ::unsetenv("DS_LOG_LEVEL");
  ::unsetenv("DS_LOG_ALL_RANKS");
  EXPECT_EQ(env::get_string("DS_LOG_LEVEL"), "info");
  EXPECT_FALSE(env::get_bool("DS_LOG_ALL_RANKS"));
  EXPECT_FALSE(env::is_set("DS_LOG_LEVEL"));
  ScopedEnv empty("DS_LOG_LEVEL", "");
  EXPECT_FALSE(env::is_set("DS_LOG_LEVEL"));  // empty counts as unset
}

TEST(Env, StrictParsingNamesTheVariable) {
  {
    ScopedEnv e("DS_LOG_ALL_RANKS", "maybe");
    EXPECT_HAS(error_of([] { env::get_bool("DS_LOG_ALL_RANKS"); }), "environment variable DS_LOG_ALL_RANKS='maybe'");
    EXPECT_HAS(error_of([] { env::check_all(); }), "DS_LOG_ALL_RANKS");
  }
  {
    ScopedEnv e("DS_LOG_LEVEL", "verbose");
    EXPECT_HAS(error_of([] { env::get_string("DS_LOG_LEVEL"); }), "expected one of debug|info|warn|error");
  }
  {
    ScopedEnv e("DS_COMM_TIMEOUT", "10x");
    EXPECT_HAS(error_of([] { env::get_seconds("DS_COMM_TIMEOUT"); }), "DS_COMM_TIMEOUT='10x'");
  }
  ScopedEnv e("DS_COMM_TIMEOUT", "2.5");
  EXPECT_DOUBLE_EQ(env::get_seconds("DS_COMM_TIMEOUT"), 2.5);
  EXPECT_EQ(error_of([] { env::check_all(); }), "(no error)");
}

TEST(Env, SizesAndBools) {
  EXPECT_EQ(env::parse_size("4K", "x"), 4096u);
  EXPECT_EQ(env::parse_size("3m", "x"), 3u << 20);
  EXPECT_EQ(env::parse_size("1G", "x"), 1u << 30);
  EXPECT_HAS(error_of([] { env::parse_size("4KB", "SRC"); }), "SRC: expected a size");
  EXPECT_HAS(error_of([] { env::parse_size("-1", "SRC"); }), "SRC: expected a size");
  EXPECT_HAS(error_of([] { env::parse_size("99999999999999999999", "SRC"); }), "expected a size");
  EXPECT_TRUE(env::parse_bool("on", "x"));
  EXPECT_FALSE(env::parse_bool("0", "x"));
}

TEST(Env, UnregisteredAndWrongTypeReadsAreRefused) {
  EXPECT_HAS(error_of([] { env::get_bool("DS_NO_SUCH_VARIABLE"); }), "not in the registry");
  EXPECT_HAS(error_of([] { env::get_bool("DS_LOG_LEVEL"); }), "wrong type");
  EXPECT_HAS(error_of([] { env::external("DS_LOG_LEVEL"); }), "register it");
  ScopedEnv e("OMPI_COMM_WORLD_SIZE_TEST_ONLY", "3");
  EXPECT_EQ(env::external("OMPI_COMM_WORLD_SIZE_TEST_ONLY").value_or(""), "3");
  EXPECT_FALSE(env::external("SURELY_UNSET_VARIABLE_42").has_value());
}

// What ds_report --env prints per row (and docs/user/environment.md is checked against).
TEST(Env, NamesForTheReport) {
  EXPECT_STREQ(env::class_name(env::Class::System), "system");
  EXPECT_STREQ(env::class_name(env::Class::Debug), "debug");
  EXPECT_STREQ(env::type_name(env::Type::Seconds), "seconds");
  EXPECT_STREQ(env::type_name(env::Type::Choice), "choice");
  EXPECT_EQ(env::accepted(env::find("DS_NN_ROWS")), "one of auto|plain");
  EXPECT_EQ(env::accepted(env::find("DS_CPU_ISA")), "one of auto|avx512|avx2|neon|plain");
  for (const env::Var& v : env::table()) EXPECT_FALSE(env::accepted(v).empty()) << v.name;
}

// Every non-empty default parses with its row's own type (a default the getter would refuse
// would fail every read of an unset variable).
TEST(Env, DefaultsParseWithTheirType) {
  for (const env::Var& v : env::table()) {
    if (!*v.default_value) continue;
    ScopedEnv unset(v.name, "");  // empty counts as unset: the default is parsed
    switch (v.type) {
      case env::Type::Bool: EXPECT_NO_THROW(env::get_bool(v.name)) << v.name; break;
      case env::Type::Int: EXPECT_NO_THROW(env::get_int(v.name)) << v.name; break;
      case env::Type::Size: EXPECT_NO_THROW(env::get_size(v.name)) << v.name; break;
      case env::Type::Seconds: EXPECT_NO_THROW(env::get_seconds(v.name)) << v.name; break;
      case env::Type::String:
      case env::Type::Choice: EXPECT_NO_THROW(env::get_string(v.name)) << v.name; break;
    }
  }
}
