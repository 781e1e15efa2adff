// Runs a scope on another CPU kernel set (DS_CPU_ISA) and puts the previous setting back, so a
// test binary run as a whole under DS_CPU_ISA=avx2 (the ISA matrix in tests/CMakeLists.txt)
// returns to avx2, not to the CPU's best, after a case that forced plain.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "ds/core/cpu_features.h"

namespace ds_test {

// The kernel sets this CPU can run, lowest first: the ones a test loops over.
inline std::vector<ds::CpuIsa> runnable_isas() {
  const ds::CpuIsa best = ds::cpu_isa_best();
  if (best == ds::CpuIsa::neon) return {ds::CpuIsa::plain, ds::CpuIsa::neon};
  std::vector<ds::CpuIsa> out;
  for (int i = 0; i <= static_cast<int>(best); ++i) out.push_back(static_cast<ds::CpuIsa>(i));
  return out;
}

class ScopedIsa {
 public:
  explicit ScopedIsa(const char* isa) {
    if (const char* v = std::getenv("DS_CPU_ISA")) saved_ = v;
    setenv("DS_CPU_ISA", isa, 1);
  }
  ~ScopedIsa() {
    if (saved_) setenv("DS_CPU_ISA", saved_->c_str(), 1);
    else unsetenv("DS_CPU_ISA");
  }
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  std::optional<std::string> saved_;
};

}  // namespace ds_test
