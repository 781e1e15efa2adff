// make_communicator(): the one place that knows which backends were compiled in.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "ds/mpi/communicator.h"
#include "ds/mpi/init.h"

namespace ds {

// backend "mpi": MpiComm over ctx.mpi_comm (host memory; ctx.comm is one already).
// backend "nccl": NcclComm on device ctx.device (device memory); ds::Error when NCCL was not
//   compiled in or no GPU is visible.
// backend "staged": StagedComm on device ctx.device (device memory staged through pinned host
//   memory over MPI; ranks may share a GPU); ds::Error when the build has no CUDA or a rank
//   has no usable device.
// backend "auto": nccl when compiled in and a GPU is visible, else mpi.
// Collective over ctx.mpi_comm. Anything else throws ds::Error naming the backend.
std::shared_ptr<Communicator> make_communicator(DistributedContext& ctx, std::string_view backend = "auto");

// What the build and the machine offer, for ds_report.
struct BackendInfo {
  bool nccl_compiled = false;
  std::optional<std::string> cuda_runtime;  // "13.0" (cudaRuntimeGetVersion)
  std::optional<std::string> cuda_driver;   // "13.0" (cudaDriverGetVersion; absent without a driver)
  std::optional<std::string> nccl;          // "2.27.3" (ncclGetVersion)
  int gpu_count = 0;                        // visible devices (0 when cudaGetDeviceCount fails)
  std::string gpu_error;                    // why there is no GPU, when there is none
};
BackendInfo backend_info();

}  // namespace ds
