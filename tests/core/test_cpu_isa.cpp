// The CPU kernel-set rule (ds/core/cpu_features.h): the best ISA by default, DS_CPU_ISA lowers
// it, naming one the CPU lacks is an error saying what is missing.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/core/cpu_features.h"
#include "ds/core/error.h"
#include "scoped_isa.h"

using ds::CpuIsa;


TEST(CpuIsa, AutoIsTheBestTheCpuHas) {
  ds_test::ScopedIsa isa("auto");
  EXPECT_EQ(ds::cpu_isa(), ds::cpu_isa_best());
  EXPECT_NE(ds::cpu_isa_reason().find("the best this CPU has"), std::string::npos) << ds::cpu_isa_reason();
}

TEST(CpuIsa, EveryRunnableIsaCanBeForced) {
  for (CpuIsa want : ds_test::runnable_isas()) {
    ds_test::ScopedIsa isa(ds::isa_name(want));
    EXPECT_EQ(ds::cpu_isa(), want);
    EXPECT_TRUE(ds::isa_at_least(want));
    EXPECT_TRUE(ds::isa_at_least(CpuIsa::plain));
    const std::string why = ds::cpu_isa_reason();
    EXPECT_NE(why.find(std::string("DS_CPU_ISA=") + ds::isa_name(want)), std::string::npos) << why;
  }
}

TEST(CpuIsa, PlainIsBelowEveryOther) {
  ds_test::ScopedIsa isa("plain");
  EXPECT_FALSE(ds::isa_at_least(CpuIsa::avx2));
  EXPECT_FALSE(ds::isa_at_least(CpuIsa::avx512));
  EXPECT_FALSE(ds::isa_at_least(CpuIsa::neon));
}

TEST(CpuIsa, AnIsaTheCpuLacksIsAnErrorNamingWhatIsMissing) {
  // The other architecture's ISA is always missing.
  const char* foreign = ds::cpu_isa_best() == CpuIsa::neon ? "avx2" : "neon";
  ds_test::ScopedIsa isa(foreign);
  try {
    (void)ds::cpu_isa();
    FAIL() << "DS_CPU_ISA=" << foreign << " accepted";
  } catch (const ds::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::string("DS_CPU_ISA='") + foreign + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("this CPU lacks"), std::string::npos) << msg;
  }
}

TEST(CpuIsa, AnUnknownValueIsAnErrorListingTheChoices) {
  ds_test::ScopedIsa isa("sse2");
  try {
    (void)ds::cpu_isa();
    FAIL() << "DS_CPU_ISA=sse2 accepted";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("auto|avx512|avx2|neon|plain"), std::string::npos) << e.what();
  }
}
