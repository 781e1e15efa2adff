#include "ds/core/cpu_features.h"

#include "ds/core/env.h"
#include "ds/core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ds {

namespace {
#if defined(__x86_64__)
// XGETBV: which register states the OS saves (AVX needs YMM, AVX-512 needs ZMM + opmask).
unsigned long long xgetbv0() {
  unsigned eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

// Read from CPUID directly (not __builtin_cpu_supports, whose feature names differ between
// GCC and clang 14), and gated on the OS enabling the vector register state.
CpuFeatures probe() {
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
}
#else
CpuFeatures probe() {
  CpuFeatures c;
#if defined(__aarch64__)
  c.neon = true;  // Advanced SIMD is mandatory in ARMv8-A
#endif
  return c;
}
#endif

bool has_avx2_set(const CpuFeatures& c) { return c.avx2 && c.fma && c.f16c; }
bool has_avx512_set(const CpuFeatures& c) {
  return c.avx512f && c.avx512bw && c.avx512vl && has_avx2_set(c);
}

// What the CPU lacks for `isa`, in words ("" = nothing).
std::string lacks(CpuIsa isa) {
  const CpuFeatures& c = cpu_features();
  switch (isa) {
    case CpuIsa::plain: return "";
    case CpuIsa::neon: return c.neon ? "" : "aarch64 Advanced SIMD (it is not an aarch64 CPU)";
    case CpuIsa::avx2: return has_avx2_set(c) ? "" : "AVX2 with FMA and F16C";
    case CpuIsa::avx512: return has_avx512_set(c) ? "" : "AVX-512 F/BW/VL with FMA and F16C";
  }
  return "";
}

CpuIsa parse_isa(const std::string& s) {
  if (s == "avx512") return CpuIsa::avx512;
  if (s == "avx2") return CpuIsa::avx2;
  if (s == "neon") return CpuIsa::neon;
  return CpuIsa::plain;
}
}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures f = probe();
  return f;
}

std::string cpu_features_string() {
  const CpuFeatures& c = cpu_features();
  std::string s;
  auto add = [&](bool on, const char* name) { if (on) { if (!s.empty()) s += ' '; s += name; } };
  add(c.avx2, "avx2"); add(c.fma, "fma"); add(c.f16c, "f16c");
  add(c.avx512f, "avx512f"); add(c.avx512bw, "avx512bw"); add(c.avx512vl, "avx512vl");
  add(c.avx512_bf16, "avx512_bf16"); add(c.avx512_fp16, "avx512_fp16"); add(c.neon, "neon");
  return s.empty() ? "none" : s;
}

const char* isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::plain: return "plain";
    case CpuIsa::avx2: return "avx2";
    case CpuIsa::avx512: return "avx512";
    case CpuIsa::neon: return "neon";
  }
  return "?";
}

CpuIsa cpu_isa_best() {
  static const CpuIsa best = [] {
    const CpuFeatures& c = cpu_features();
    if (c.neon) return CpuIsa::neon;
    if (has_avx512_set(c)) return CpuIsa::avx512;
    if (has_avx2_set(c)) return CpuIsa::avx2;
    return CpuIsa::plain;
  }();
  return best;
}

CpuIsa cpu_isa() {
  const std::string forced = env::get_string("DS_CPU_ISA");
  if (forced.empty() || forced == "auto") return cpu_isa_best();
  const CpuIsa isa = parse_isa(forced);
  const std::string missing = lacks(isa);
  DS_CHECK(missing.empty(), "environment variable DS_CPU_ISA='" << forced << "': this CPU lacks " << missing
                                << " (its best is " << isa_name(cpu_isa_best()) << "; it has: "
                                << cpu_features_string() << ")");
  return isa;
}

std::string cpu_isa_reason() {
  const CpuIsa best = cpu_isa_best(), now = cpu_isa();
  const std::string forced = env::get_string("DS_CPU_ISA");
  if (forced.empty() || forced == "auto") return std::string(isa_name(now)) + " (the best this CPU has)";
  return std::string(isa_name(now)) + " (forced by DS_CPU_ISA=" + forced + "; the CPU's best is " +
         isa_name(best) + ")";
}

}  // namespace ds
