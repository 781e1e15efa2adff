// DS_CUDA_CHECK: for .cu files and CUDA host code only (needs cuda_runtime.h).
// DS_CU_CHECK: the same for the CUDA driver API (CUresult), e.g. the virtual memory calls of
// the device paged buffer.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "ds/core/error.h"

#define DS_CUDA_CHECK(call)                                                              \
  do {                                                                                   \
    cudaError_t ds_cuda_err_ = (call);                                                   \
    if (ds_cuda_err_ != cudaSuccess) {                                                   \
      int ds_dev_ = -1;                                                                  \
      cudaGetDevice(&ds_dev_);                                                           \
      DS_THROW("CUDA call " #call " failed on device " << ds_dev_ << ": "              \
               << cudaGetErrorName(ds_cuda_err_) << " (" << cudaGetErrorString(ds_cuda_err_) << ")"); \
    }                                                                                    \
  } while (0)

// After a kernel launch: reports launch-configuration errors at the launch site.
#define DS_CUDA_CHECK_LAUNCH() DS_CUDA_CHECK(cudaGetLastError())

namespace ds::detail {
// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a driver result. dstrain never links the
// driver library (libcuda.so.1 is absent on machines without a GPU, where the CPU path must
// still start): its functions come through the runtime's entry-point lookup, this one too.
inline std::string cu_error_text(CUresult r) {
  using Fn = CUresult (*)(CUresult, const char**);
  struct Fns {
    Fn name = nullptr, text = nullptr;
  };
  static const Fns fns = [] {  // looked up once (a thread-safe static)
    auto lookup = [](const char* symbol) -> Fn {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      const bool ok = cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
                      q == cudaDriverEntryPointSuccess;
      if (!ok) cudaGetLastError();  // not found: leave no error behind in the runtime
      return ok ? reinterpret_cast<Fn>(p) : nullptr;
    };
    return Fns{lookup("cuGetErrorName"), lookup("cuGetErrorString")};
  }();
  const char* name = nullptr;
  const char* text = nullptr;
  if (fns.name) fns.name(r, &name);
  if (fns.text) fns.text(r, &text);
  std::string out = name ? name : "CUresult " + std::to_string(int(r));
  if (text) out += std::string(" (") + text + ")";
  return out;
}
}  // namespace ds::detail

// The driver call's text, file and line (DS_THROW) and the driver's error name and text.
#define DS_CU_CHECK(call)                                                                \
  do {                                                                                   \
    CUresult ds_cu_err_ = (call);                                                        \
    if (ds_cu_err_ != CUDA_SUCCESS) {                                                    \
      int ds_dev_ = -1;                                                                  \
      cudaGetDevice(&ds_dev_);                                                           \
      DS_THROW("CUDA driver call " #call " failed on device " << ds_dev_ << ": "       \
               << ::ds::detail::cu_error_text(ds_cu_err_));                              \
    }                                                                                    \
  } while (0)
