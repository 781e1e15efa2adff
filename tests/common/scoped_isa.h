// Runs a scope on another CPU kernel set (DS_CPU_ISA) and puts the previous setting back, so a
// test binary run as a whole under DS_CPU_ISA=avx2 (the ISA matrix in tests/CMakeLists.txt)
// returns to avx2, not to the CPU's best, after a case that forced plain.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace ds_test {

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
