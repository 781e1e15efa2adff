// The communicator back ends, one row each (as the launcher's back ends in ds/launch/backend.h):
// the name make_communicator() takes and Communicator::backend() returns, and whether its
// buffers are device memory (then it is a communication.device_backend choice). The factory
// and the device-backend rule check names against this table and list it in their errors.
#pragma once

#include <span>
#include <string>
#include <string_view>

namespace ds {

struct CommBackend {
  std::string_view name;
  bool device_memory;
};

inline constexpr std::string_view kMpiBackend = "mpi";        // MpiComm: host memory over MPI
inline constexpr std::string_view kNcclBackend = "nccl";      // NcclComm: a GPU per rank
inline constexpr std::string_view kStagedBackend = "staged";  // StagedComm: device memory through pinned host memory

std::span<const CommBackend> comm_backends();
// The row of `name`; nullptr when none has it ("auto" is a choice, not a back end).
const CommBackend* find_comm_backend(std::string_view name);
// "auto", then every back end (device_only: those with device memory), as "auto, mpi, nccl or
// staged"; quoted: each in double quotes.
std::string comm_backend_choices(bool device_only, bool quoted);

}  // namespace ds
