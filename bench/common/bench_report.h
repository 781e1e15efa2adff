// One benchmark run's record and verdict, shared by every benchmark in bench/ (bench/README.md).
//
// A benchmark (1) checks that its result is right (wrong elements against the expected sum,
// an optimizer step against the reference kernel, a loss that falls, ranks that agree, a load
// equal to the save) and (2) states its figure as a ratio against a reference measured in the
// same run (raw MPI, the memory-bandwidth pattern kernel, the sgemm bound, dd, stage 0): the
// headline, a median. After its usual human-readable output it prints the verdict and, as the
// LAST line on stdout, one JSON object:
//
//   JSON: {"bench": "comm_bench", "ok": true, "headline": "...", "ratio": 1.23, "min_ratio": 0, ...}
//
// bench/run_all.sh collects these lines. Exit status: 0 when every check passed and the ratio
// is at least --min_ratio (default 0: no floor), 1 when a result check failed, 3 when the
// ratio is below --min_ratio (or none was measured while a floor was set); 2 stays "bad
// arguments". MPI benchmarks call finish() on every rank with the same checks (the counts are
// reduced first); only rank 0 prints.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/cpu_features.h"

namespace ds::bench {

// The median (mean of the middle two for an even count); NaN for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// --min_ratio's value: a number >= 0, else one line naming the flag and exit 2.
inline double parse_min_ratio(const char* bench, const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v >= 0) || !std::isfinite(v)) {
    std::fprintf(stderr, "%s: error: --min_ratio: expected a number >= 0, got '%s'\n", bench, s.c_str());
    std::exit(2);
  }
  return v;
}

class Report {
 public:
  explicit Report(std::string bench) : bench_(std::move(bench)) {
    j_["bench"] = bench_;
    j_["checks"] = nlohmann::json::array();
  }

  // Benchmark-specific fields (sizes, rates, rows, options).
  nlohmann::json& operator[](const std::string& key) { return j_[key]; }

  // The headline: `what` says which ratio (ours over the reference, higher is better) and how
  // it was reduced to one number (a median).
  void headline(std::string what, double ratio) {
    headline_ = std::move(what);
    ratio_ = ratio;
  }
  void min_ratio(double v) { min_ratio_ = v; }

  // One result check: `what` it verified, whether it passed, and the evidence.
  void check(const std::string& what, bool passed, const std::string& detail) {
    j_["checks"].push_back({{"what", what}, {"ok", passed}, {"detail", detail}});
    if (!passed) failures_.push_back(what + ": " + detail);
  }
  bool checks_passed() const { return failures_.empty(); }

  // Prints the verdict (failures on stderr) and the JSON line when `print` (rank 0 of an MPI
  // benchmark; true elsewhere); returns the exit status (see the header comment).
  int finish(bool print = true) {
    const bool has_ratio = std::isfinite(ratio_);
    const bool below = min_ratio_ > 0 && !(has_ratio && ratio_ >= min_ratio_);
    const int code = !failures_.empty() ? 1 : below ? 3 : 0;
    j_["ok"] = code == 0;
    j_["headline"] = headline_;
    j_["ratio"] = has_ratio ? nlohmann::json(ratio_) : nlohmann::json(nullptr);
    j_["min_ratio"] = min_ratio_;
    j_["below_min_ratio"] = below;
    j_["load_average"] = load_average();
    j_["cpus"] = std::thread::hardware_concurrency();
    j_["cpu_isa"] = cpu_isa_name();
    j_["utc"] = utc_now();
    if (!print) return code;
    for (const auto& f : failures_) std::fprintf(stderr, "%s: error: result check failed: %s\n", bench_.c_str(), f.c_str());
    if (below) {
      if (has_ratio)
        std::fprintf(stderr, "%s: error: %s = %.3f is below --min_ratio %.3f\n", bench_.c_str(), headline_.c_str(), ratio_,
                     min_ratio_);
      else
        std::fprintf(stderr, "%s: error: no headline ratio measured (%s) but --min_ratio %.3f was given\n", bench_.c_str(),
                     headline_.c_str(), min_ratio_);
    }
    std::printf("# %s: %zu result check(s) %s; %s = %s (min_ratio %g): %s\n", bench_.c_str(), j_["checks"].size(),
                failures_.empty() ? "passed" : "FAILED", headline_.c_str(), has_ratio ? fmt(ratio_).c_str() : "n/a",
                min_ratio_, code == 0 ? "ok" : code == 1 ? "FAILED (wrong result)" : "FAILED (below --min_ratio)");
    std::printf("JSON: %s\n", j_.dump().c_str());
    std::fflush(stdout);
    std::fflush(stderr);
    return code;
  }

 private:
  static std::string fmt(double v) {
    char s[32];
    std::snprintf(s, sizeof s, "%.3f", v);
    return s;
  }
  // The CPU kernel set the run used (ds::cpu_isa(): DS_CPU_ISA or the CPU's best).
  static std::string cpu_isa_name() {
    try {
      return ds::isa_name(ds::cpu_isa());
    } catch (const std::exception& e) {
      return std::string("invalid: ") + e.what();
    }
  }
  static std::string load_average() {
    std::ifstream f("/proc/loadavg");
    std::string a, b, c;
    f >> a >> b >> c;
    return a + " " + b + " " + c;
  }
  static std::string utc_now() {
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char s[32];
    std::strftime(s, sizeof s, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return s;
  }

  std::string bench_;
  nlohmann::json j_;
  std::string headline_ = "(none)";
  double ratio_ = std::numeric_limits<double>::quiet_NaN();
  double min_ratio_ = 0;
  std::vector<std::string> failures_;
};

}  // namespace ds::bench
