// DS_MPI_CHECK: the one check macro of the mpi/ library.
//
// MPI calls on our communicators return error codes because init_distributed() and MpiComm
// install MPI_ERRORS_RETURN; the macro turns a failure into ds::Error naming the call, the
// file, the line, the rank and MPI's own text (MPI_Error_string).
#pragma once

#include <mpi.h>

#include "ds/core/error.h"

namespace ds {

// Builds "MPI call <call> failed: <MPI_Error_string(code)> (error class N)" and throws
// ds::Error (throw_error adds file, line and rank).
[[noreturn]] void throw_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace ds

#define DS_MPI_CHECK(call)                                                    \
  do {                                                                        \
    int ds_mpi_rc_ = (call);                                                  \
    if (ds_mpi_rc_ != MPI_SUCCESS)                                            \
      ::ds::throw_mpi_error(ds_mpi_rc_, #call, __FILE__, __LINE__);           \
  } while (0)
