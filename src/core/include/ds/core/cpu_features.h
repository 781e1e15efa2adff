// What SIMD the CPU running us has, and which kernel set (ISA) the CPU code uses.
//
// The rule, as `ds_report` prints it: the kernels use the best ISA the CPU has, in the order
// avx512 > avx2 > plain on x86-64 and neon > plain on aarch64, unless DS_CPU_ISA names a
// lower one. Each ISA needs:
//   avx512  AVX-512 F, BW and VL, with FMA and F16C (bf16 dot products also need AVX512-BF16)
//   avx2    AVX2 with FMA and F16C
//   neon    an aarch64 CPU (Advanced SIMD is part of the architecture)
//   plain   nothing: the portable loops every kernel is checked against
// A kernel that has no version for the ISA in use runs its next lower one (a GEMM without its
// own kernel goes to OpenBLAS). DS_CPU_ISA naming an ISA this CPU lacks is an error.
//
// Threading: cpu_isa() reads DS_CPU_ISA on every call (tests switch it between cases); the
// CPUID probe runs once.
#pragma once

#include <string>

namespace ds {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512_bf16 = false, avx512_fp16 = false;
  bool neon = false;
};

const CpuFeatures& cpu_features();
// "avx2 fma f16c avx512f ..." — what the kernels can use on this CPU.
std::string cpu_features_string();
// Threads the CPU kernels use (OpenMP's max, honouring OMP_NUM_THREADS).
int cpu_threads();

// Kernel sets, lowest first within an architecture.
enum class CpuIsa { plain, avx2, avx512, neon };

// "plain", "avx2", "avx512", "neon".
const char* isa_name(CpuIsa isa);
// The best ISA this CPU has (the rule above, without DS_CPU_ISA).
CpuIsa cpu_isa_best();
// The ISA the kernels use now: DS_CPU_ISA when set (and not "auto"), else cpu_isa_best().
// Throws ds::Error when DS_CPU_ISA names an ISA this CPU lacks, naming what it lacks.
CpuIsa cpu_isa();
// One line on why: "avx2 (forced by DS_CPU_ISA=avx2; the CPU's best is avx512)".
std::string cpu_isa_reason();
// Whether the ISA in use is `isa` or a higher one of the same architecture.
inline bool isa_at_least(CpuIsa isa) {
  const CpuIsa now = cpu_isa();
  if (isa == CpuIsa::plain) return true;
  if (now == CpuIsa::neon || isa == CpuIsa::neon) return now == isa;
  return static_cast<int>(now) >= static_cast<int>(isa);
}

}  // namespace ds
