// The only file that knows which communication backends were compiled in.
#include "ds/mpi/comm_factory.h"

#include "ds/core/error.h"
#include "ds/mpi/comm_backends.h"
#include "ds/mpi/mpi_comm.h"
#include "ds/mpi/staged_comm.h"

#if DS_HAVE_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include "ds/mpi/nccl_comm.h"
#endif

namespace ds {

BackendInfo backend_info() {
  BackendInfo info;
#if DS_HAVE_NCCL
  info.nccl_compiled = true;
  int v = 0;
  if (cudaRuntimeGetVersion(&v) == cudaSuccess)
    info.cuda_runtime = std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  if (cudaDriverGetVersion(&v) == cudaSuccess && v > 0)
    info.cuda_driver = std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  if (ncclGetVersion(&v) == ncclSuccess) {
    // NCCL >= 2.9 encodes major*10000 + minor*100 + patch.
    info.nccl = std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
  }
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc == cudaSuccess) {
    info.gpu_count = count;
    if (count == 0) info.gpu_error = "no CUDA device visible";
  } else {
    info.gpu_error = cudaGetErrorString(rc);
    cudaGetLastError();  // clear the sticky-free error so later calls are not confused
  }
#else
  info.gpu_error = "built without CUDA/NCCL";
#endif
  return info;
}

std::shared_ptr<Communicator> make_communicator(DistributedContext& ctx, std::string_view backend) {
  if (ctx.mpi_comm == MPI_COMM_NULL) DS_THROW("make_communicator: the distributed context is not initialized (or was finalized)");
  if (backend != "auto" && !find_comm_backend(backend))
    DS_THROW("make_communicator: unknown backend '" << backend << "' (expected " << comm_backend_choices(false, false)
                                                   << ")");
  // StagedComm throws ds::Error itself in a build without CUDA or on a rank without a device.
  if (backend == kStagedBackend) return std::make_shared<StagedComm>(ctx.mpi_comm, ctx.device, ctx.runtime);
  bool want_nccl = backend == kNcclBackend;
#if DS_HAVE_NCCL
  if (backend == "auto") {
    // Every rank must take the same decision (the constructors are collective).
    int local = backend_info().gpu_count > 0 ? 1 : 0, all = 0;
    MPI_Allreduce(&local, &all, 1, MPI_INT, MPI_MIN, ctx.mpi_comm);
    want_nccl = all == 1;
  }
  if (want_nccl) return std::make_shared<NcclComm>(ctx.mpi_comm, ctx.device);
#else
  if (want_nccl) DS_THROW("make_communicator: backend 'nccl' requested but dstrain was built without NCCL (DS_WITH_NCCL)");
#endif
  return std::make_shared<MpiComm>(ctx.mpi_comm, MpiCommOptions::from_env(), ctx.runtime);
}

}  // namespace ds
