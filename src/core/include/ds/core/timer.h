// Wall-clock timers for the step breakdown (forward / backward / reduce / step).
#pragma once

#include <chrono>
#include <map>
#include <string>

namespace ds {

class Stopwatch {
 public:
  Stopwatch() { reset(); }
  void reset() { start_ = clock::now(); }
  double elapsed_ms() const { return std::chrono::duration<double, std::milli>(clock::now() - start_).count(); }
  double elapsed_s() const { return elapsed_ms() / 1000.0; }
 private:
  using clock = std::chrono::steady_clock;
  clock::time_point start_;
};

// Named accumulating timers: start("forward") ... stop("forward"); mean_ms over the
// intervals since the last reset.
class Timers {
 public:
  void start(const std::string& name);
  void stop(const std::string& name);
  double total_ms(const std::string& name) const;
  double mean_ms(const std::string& name) const;
  int count(const std::string& name) const;
  void reset();
 private:
  struct Entry { Stopwatch sw; double total_ms = 0; int count = 0; bool running = false; };
  std::map<std::string, Entry> entries_;
};

}  // namespace ds
