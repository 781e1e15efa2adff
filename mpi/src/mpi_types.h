// MPI datatypes and reduction ops for dstrain's dtypes (private to ds_mpi): the checks every
// collective makes on its op and dtype, and avg's division after the sum.
#pragma once

#include <mpi.h>

#include <cstddef>

#include "ds/core/dtype.h"
#include "ds/mpi/communicator.h"

namespace ds {

// MPI datatype and op for a dtype / reduction (F16/BF16 and their ops are user-defined,
// created on first use). Throw ds::Error naming op and dtype when unsupported.
MPI_Datatype mpi_datatype(DType t);
MPI_Op mpi_reduce_op(ReduceOp op, DType t);

namespace detail {

// ds::Error "MpiComm::<what>: ..." naming op and dtype when the mpi backend cannot reduce them.
void check_op(ReduceOp op, DType t, const char* what);

// avg = sum / size, applied after the sum on every path (so both paths round alike).
void divide(void* p, std::size_t n, DType t, int by);

}  // namespace detail

}  // namespace ds
