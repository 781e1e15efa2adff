/* C entry points of libds_capi.so, for mpi4py programs (ctypes) and C callers.
 *
 * `comm` is a Fortran handle: what mpi4py's comm.py2f() returns (a C int in Open MPI).
 * The library wraps that communicator (COMM_WORLD or any sub-communicator) in an MpiComm --
 * created on first use, cached on the communicator as an MPI attribute, freed when the
 * communicator is freed or MPI is finalized -- and runs dstrain's all-reduce on it (the
 * shared-memory path included). MPI must already be initialized (mpi4py does it); the
 * library never initializes or finalizes MPI. All ranks of `comm` must call alike.
 *
 * Return value: 0 on success, nonzero on error; ds_capi_last_error() tells why. */
#pragma once

#include <mpi.h>

#ifdef __cplusplus
extern "C" {
#endif

/* op: 0 sum, 1 avg, 2 max, 3 min.  dtype: 0 fp32, 1 fp16, 2 bf16, 3 fp64, 4 int32, 5 int64 */
int ds_allreduce(MPI_Fint comm, void* data, long long n, int dtype, int op);
int ds_allreduce_sum_f32(MPI_Fint comm, float* data, long long n);
int ds_allreduce_sum_f64(MPI_Fint comm, double* data, long long n);
/* 1 when the communicator's all-reduce uses the shared-memory window, 0 if not, <0 on error */
int ds_comm_uses_shm(MPI_Fint comm);
const char* ds_capi_last_error(void);

#ifdef __cplusplus
}
#endif
