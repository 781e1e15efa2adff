#include "ds/core/cpu_features.h"

#include <omp.h>

namespace ds {

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    __builtin_cpu_init();
    c.avx2 = __builtin_cpu_supports("avx2");
    c.fma = __builtin_cpu_supports("fma");
    c.f16c = __builtin_cpu_supports("f16c");
    c.avx512f = __builtin_cpu_supports("avx512f");
    c.avx512bw = __builtin_cpu_supports("avx512bw");
    c.avx512vl = __builtin_cpu_supports("avx512vl");
    c.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
    c.avx512_fp16 = __builtin_cpu_supports("avx512fp16");
    return c;
  }();
  return f;
}

std::string cpu_features_string() {
  const CpuFeatures& c = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) { if (on) { if (!s.empty()) s += ' '; s += name; } };
  add(c.avx2, "avx2"); add(c.fma, "fma"); add(c.f16c, "f16c");
  add(c.avx512f, "avx512f"); add(c.avx512bw, "avx512bw"); add(c.avx512vl, "avx512vl");
  add(c.avx512_bf16, "avx512_bf16"); add(c.avx512_fp16, "avx512_fp16");
  return s.empty() ? "none" : s;
}

int cpu_threads() { return omp_get_max_threads(); }

}  // namespace ds
