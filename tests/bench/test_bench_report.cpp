// bench/common/bench_report.h: the median every headline uses, and the verdict every benchmark
// ends with (exit status, the verdict lines, the JSON: record as the last stdout line).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "bench_report.h"
#include "ds/core/cpu_features.h"

namespace {

// Runs finish() with stdout and stderr captured; returns {exit status, stdout, stderr}.
struct Finished {
  int code;
  std::string out, err;
};
Finished finish(ds::bench::Report& r) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = r.finish();
  std::string out = testing::internal::GetCapturedStdout();
  std::string err = testing::internal::GetCapturedStderr();
  return {code, out, err};
}

// The last line of `out`, without "JSON: ", parsed.
nlohmann::json record(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const std::string last = s.substr(s.rfind('\n') == std::string::npos ? 0 : s.rfind('\n') + 1);
  EXPECT_EQ(last.rfind("JSON: ", 0), 0u) << out;
  return nlohmann::json::parse(last.substr(6));
}

}  // namespace

TEST(BenchReport, Median) {
  EXPECT_EQ(ds::bench::median({3.0, 1.0, 2.0}), 2.0);
  EXPECT_EQ(ds::bench::median({4.0, 1.0, 3.0, 2.0}), 2.5);
  EXPECT_TRUE(std::isnan(ds::bench::median({})));
}

TEST(BenchReport, PassesAtOrAboveTheFloor) {
  ds::bench::Report r("b");
  r["rows"] = 3;
  r.check("sums", true, "0 wrong");
  r.headline("ours / ref", 1.5);
  r.min_ratio(1.5);
  const Finished f = finish(r);
  EXPECT_EQ(f.code, 0);
  EXPECT_TRUE(f.err.empty()) << f.err;
  const auto j = record(f.out);
  EXPECT_EQ(j["bench"], "b");
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["ratio"], 1.5);
  EXPECT_EQ(j["min_ratio"], 1.5);
  EXPECT_EQ(j["rows"], 3);
  EXPECT_EQ(j["checks"][0]["what"], "sums");
  EXPECT_EQ(j["headline"], "ours / ref");
}

TEST(BenchReport, BelowTheFloorExits3AndSaysWhy) {
  ds::bench::Report r("b");
  r.check("sums", true, "0 wrong");
  r.headline("ours / ref", 0.8);
  r.min_ratio(1.0);
  const Finished f = finish(r);
  EXPECT_EQ(f.code, 3);
  EXPECT_NE(f.err.find("b: error: ours / ref = 0.800 is below --min_ratio 1.000"), std::string::npos) << f.err;
  const auto j = record(f.out);
  EXPECT_EQ(j["ok"], false);
  EXPECT_EQ(j["below_min_ratio"], true);
}

TEST(BenchReport, AWrongResultExits1EvenAboveTheFloor) {
  ds::bench::Report r("b");
  r.check("sums", false, "3 wrong of 10");
  r.headline("ours / ref", 5.0);
  const Finished f = finish(r);
  EXPECT_EQ(f.code, 1);
  EXPECT_NE(f.err.find("b: error: result check failed: sums: 3 wrong of 10"), std::string::npos) << f.err;
  EXPECT_EQ(record(f.out)["ok"], false);
}

TEST(BenchReport, NoRatioFailsOnlyWithAFloor) {
  ds::bench::Report a("b");
  a.headline("none", std::nan(""));
  const Finished fa = finish(a);
  EXPECT_EQ(fa.code, 0);
  EXPECT_TRUE(record(fa.out)["ratio"].is_null());
  ds::bench::Report b("b");
  b.headline("none", std::nan(""));
  b.min_ratio(0.5);
  const Finished fb = finish(b);
  EXPECT_EQ(fb.code, 3);
  EXPECT_NE(fb.err.find("no headline ratio measured"), std::string::npos) << fb.err;
}

TEST(BenchReport, MinRatioMustBeANonNegativeNumber) {
  EXPECT_EQ(ds::bench::parse_min_ratio("b", "0.75"), 0.75);
  EXPECT_EXIT(ds::bench::parse_min_ratio("b", "x"), testing::ExitedWithCode(2),
              "b: error: --min_ratio: expected a number >= 0, got 'x'");
  EXPECT_EXIT(ds::bench::parse_min_ratio("b", "-1"), testing::ExitedWithCode(2), "--min_ratio");
}

// Every record names the CPU kernel set the run used, as DS_CPU_ISA chose it.
TEST(BenchReport, RecordNamesTheCpuKernelSet) {
  const char* saved = std::getenv("DS_CPU_ISA");
  const std::string restore = saved ? saved : "";
  for (const char* isa : {"plain", "auto"}) {
    setenv("DS_CPU_ISA", isa, 1);
    ds::bench::Report r("b");
    r.headline("ours / ref", 1.0);
    EXPECT_EQ(record(finish(r).out)["cpu_isa"], std::string(isa) == "plain" ? "plain" : ds::isa_name(ds::cpu_isa_best()))
        << isa;
  }
  if (saved) setenv("DS_CPU_ISA", restore.c_str(), 1);
  else unsetenv("DS_CPU_ISA");
}
