#include "ds/core/cpu_features.h"

#include <cpuid.h>
#include <omp.h>

namespace ds {

namespace {
// XGETBV: which register states the OS saves (AVX needs YMM, AVX-512 needs ZMM + opmask).
unsigned long long xgetbv0() {
  unsigned eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}
}  // namespace

// Read from CPUID directly (not __builtin_cpu_supports, whose feature names differ between
// GCC and clang 14), and gated on the OS enabling the vector register state.
const CpuFeatures& cpu_features() {
  static const CpuFeatures f = [] {
    CpuFeatures c;
    unsigned a, b, cx, d;
    if (!__get_cpuid(0, &a, &b, &cx, &d)) return c;
    if (!__get_cpuid(1, &a, &b, &cx, &d)) return c;
    const bool osxsave = cx & (1u << 27);
    const unsigned long long xcr0 = osxsave ? xgetbv0() : 0;
    const bool os_avx = (xcr0 & 0x6) == 0x6;
    const bool os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0;
    c.fma = os_avx && (cx & (1u << 12));
    c.f16c = os_avx && (cx & (1u << 29));
    if (__get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
      c.avx2 = os_avx && (b & (1u << 5));
      c.avx512f = os_avx512 && (b & (1u << 16));
      c.avx512bw = os_avx512 && (b & (1u << 30));
      c.avx512vl = os_avx512 && (b & (1u << 31));
      c.avx512_fp16 = os_avx512 && (d & (1u << 23));
    }
    if (__get_cpuid_count(7, 1, &a, &b, &cx, &d)) c.avx512_bf16 = os_avx512 && (a & (1u << 5));
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
