// cpu_threads() (ds/core/cpu_features.h), apart from the ISA rule so that code which checks
// DS_CPU_ISA (env.cpp, and the config fuzzer that compiles it) needs no OpenMP.
#include <omp.h>

#include "ds/core/cpu_features.h"

namespace ds {

int cpu_threads() { return omp_get_max_threads(); }

}  // namespace ds
