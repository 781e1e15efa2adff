// What SIMD the CPU running us has, detected once at run time.
#pragma once

#include <string>

namespace ds {

struct CpuFeatures {
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512_bf16 = false, avx512_fp16 = false;
};

const CpuFeatures& cpu_features();
// "avx2 fma f16c avx512f ..." — what the kernels can use on this CPU.
std::string cpu_features_string();
// Threads the CPU kernels use (OpenMP's max, honouring OMP_NUM_THREADS).
int cpu_threads();

}  // namespace ds
