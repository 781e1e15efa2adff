// DS_CUDA_CHECK: for .cu files and CUDA host code only (needs cuda_runtime.h).
#pragma once

#include <cuda_runtime.h>

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
