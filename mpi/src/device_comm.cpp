// The device communicator rule (device_comm.h): a pure decision plus the collective that feeds
// it the same numbers on every rank.
#include "ds/mpi/device_comm.h"

#include <sstream>

#include "check.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/mpi/comm_backends.h"
#include "ds/mpi/comm_factory.h"

#if DS_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ds {

namespace {

std::string gpus(int n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }
std::string ranks(int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

}  // namespace

DeviceCommChoice choose_device_backend(std::string_view requested, const DeviceCommInputs& in,
                                       std::string_view source) {
  const bool own_gpu = in.local_ranks <= in.visible_devices;
  std::ostringstream why;
  const std::string staged(kStagedBackend), nccl(kNcclBackend);
  if (requested == kStagedBackend) return {staged, std::string(source) + " \"staged\""};
  if (requested == kNcclBackend) {
    DS_CHECK(in.nccl_compiled, source << " \"nccl\": dstrain was built without NCCL (DS_WITH_NCCL); use \"auto\" or "
                                         "\"staged\"");
    DS_CHECK(own_gpu, source << " \"nccl\": " << ranks(in.local_ranks) << " on one node see " << gpus(in.visible_devices)
                             << " and NCCL needs a GPU per rank; use \"auto\" or \"staged\" to share the GPUs");
    return {nccl, std::string(source) + " \"nccl\""};
  }
  DS_CHECK(requested == "auto", source << ": unknown device backend '" << requested << "' (expected "
                                       << comm_backend_choices(true, true) << ")");
  if (!in.nccl_compiled) return {staged, "auto: dstrain was built without NCCL"};
  if (in.visible_devices <= 0) return {staged, "auto: no GPU visible to " + ranks(in.local_ranks) + " on one node"};
  if (!own_gpu) {
    why << "auto: " << ranks(in.local_ranks) << " on one node share " << gpus(in.visible_devices)
        << ", NCCL needs a GPU per rank";
    return {staged, why.str()};
  }
  why << "auto: a GPU per rank (" << ranks(in.local_ranks) << " on a node, " << gpus(in.visible_devices) << ")";
  return {nccl, why.str()};
}

int shared_device(int device, int visible_devices) {
  if (visible_devices <= 0 || (device >= 0 && device < visible_devices)) return device;
  return ((device % visible_devices) + visible_devices) % visible_devices;
}

int visible_device_count() {
#if DS_HAVE_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // no driver: leave no sticky error behind
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

std::shared_ptr<Communicator> make_device_communicator(DistributedContext& ctx, std::string_view requested,
                                                       std::string_view source) {
  if (ctx.mpi_comm == MPI_COMM_NULL)
    DS_THROW("make_device_communicator: the distributed context is not initialized (or was finalized)");
  const int visible = visible_device_count();
  // The node with the most ranks per GPU decides for everyone (the lowest rank among equals),
  // so every rank applies the rule to the same numbers and all take the same branch.
  struct {
    int deficit, rank;
  } mine{ctx.local_size - visible, ctx.rank}, worst{};
  DS_MPI_CHECK(MPI_Allreduce(&mine, &worst, 1, MPI_2INT, MPI_MAXLOC, ctx.mpi_comm));
  int counts[2] = {ctx.local_size, visible};
  DS_MPI_CHECK(MPI_Bcast(counts, 2, MPI_INT, worst.rank, ctx.mpi_comm));
  DeviceCommInputs in;
  in.local_ranks = counts[0];
  in.visible_devices = counts[1];
  in.nccl_compiled = backend_info().nccl_compiled;
  const DeviceCommChoice choice = choose_device_backend(requested, in, source);
  ctx.device = shared_device(ctx.device, visible);
  DS_INFO("device communicator: " << choice.backend << " (" << choice.reason << ")");
  return make_communicator(ctx, choice.backend);
}

}  // namespace ds
