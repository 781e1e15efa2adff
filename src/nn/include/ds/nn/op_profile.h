// The per-op profile of a model's forward/backward (benchmarks), shared by Gpt and GptCuda:
// one row per op name with its totals. Gpt adds each kernel call's process CPU time and
// elapsed time; GptCuda adds each op's device time, measured between two CUDA events.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds::nn {

struct OpTime {
  std::string op;
  double cpu_s = 0;   // process CPU time, all threads (0 for device ops)
  double wall_s = 0;  // elapsed time: host clock, or device time between CUDA events
  std::int64_t calls = 0;
  double flops = 0;   // GEMM FLOPs of the op (0 for the others)
};

class OpProfile {
 public:
  // Drops every total; `ops` are listed first (in that order, at zero) and can then be
  // added to by index.
  void reset(std::span<const char* const> ops = {}) {
    rows_.clear();
    for (const char* op : ops) rows_.push_back(OpTime{op});
  }
  // One call of row `index` (of the names given to reset).
  void add(std::size_t index, double cpu_s, double wall_s, double flops = 0) {
    OpTime& r = rows_[index];
    r.cpu_s += cpu_s;
    r.wall_s += wall_s;
    r.flops += flops;
    r.calls += 1;
  }
  // One call of op `name`; a name not seen yet gets a row at the end.
  void add(std::string_view name, double cpu_s, double wall_s, double flops = 0) {
    std::size_t i = 0;
    while (i < rows_.size() && rows_[i].op != name) ++i;
    if (i == rows_.size()) rows_.push_back(OpTime{std::string(name)});
    add(i, cpu_s, wall_s, flops);
  }
  const std::vector<OpTime>& rows() const { return rows_; }

 private:
  std::vector<OpTime> rows_;
};

}  // namespace ds::nn
