// Which communicator carries a GPU model's collectives (its gradients, ZeRO-1's parameter
// gathers): the one rule ds::initialize and the train app share.
//
// The rule, as a user reads it (config key communication.device_backend, default "auto"):
//   "auto"   NCCL when dstrain was built with NCCL and every rank of each node has a GPU of
//            its own (the node's ranks <= its visible GPUs); otherwise "staged" (ranks share a
//            GPU -- NCCL refuses two ranks on one device -- or there is no NCCL).
//   "nccl"   NCCL; an error naming the key when the build has no NCCL or a node has more
//            ranks than GPUs.
//   "staged" StagedComm: device buffers staged through pinned host memory over MPI
//            (staged_comm.h); works with any number of ranks per GPU.
// When a node's ranks outnumber its GPUs, local rank r uses GPU r % GPUs.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "ds/mpi/communicator.h"
#include "ds/mpi/init.h"

namespace ds {

// What the rule looks at: the node with the fewest GPUs per rank (every rank decides alike).
struct DeviceCommInputs {
  int local_ranks = 1;      // ranks on that node
  int visible_devices = 0;  // GPUs its ranks see
  bool nccl_compiled = false;
};

struct DeviceCommChoice {
  std::string backend;  // "nccl" or "staged" (a make_communicator backend)
  std::string reason;   // why, for the log line
};

// The rule itself: no MPI, no CUDA (unit-tested on the CPU). `requested` is "auto", "nccl" or
// "staged"; `source` names where it came from in errors ("ds.json: communication.device_backend").
// Throws ds::Error for "nccl" that cannot work and for any other value.
DeviceCommChoice choose_device_backend(std::string_view requested, const DeviceCommInputs& in,
                                       std::string_view source = "communication.device_backend");

// This rank's GPU when the node's ranks share `visible_devices` GPUs: device % visible_devices
// (unchanged when it exists or no GPU is visible).
int shared_device(int device, int visible_devices);

// GPUs this process sees (cudaGetDeviceCount; 0 without CUDA in the build or without a driver).
int visible_device_count();

// Collective over ctx.mpi_comm: gathers the inputs of the node with the fewest GPUs per rank,
// moves ctx.device onto a visible GPU when ranks share them (shared_device), applies the rule,
// logs the choice once on rank 0 ("device communicator: staged (...)") and builds the
// communicator with make_communicator. Every rank throws together when the rule refuses.
std::shared_ptr<Communicator> make_device_communicator(DistributedContext& ctx, std::string_view requested,
                                                       std::string_view source = "communication.device_backend");

}  // namespace ds
