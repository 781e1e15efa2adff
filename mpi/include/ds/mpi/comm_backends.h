// The communicator back ends, one row each (as the launcher's back ends in ds/launch/backend.h):
// the name make_communicator() takes and Communicator::backend() returns, and whether its
// buffers are device memory (then it is a communication.device_backend choice). The factory
// and the device-backend rule check names against this table and list it in their errors.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace ds {

struct CommBackend {
  std::string_view name;
  bool device_memory;
};

inline constexpr std::string_view kMpiBackend = "mpi";        // MpiComm: host memory over MPI
inline constexpr std::string_view kNcclBackend = "nccl";      // NcclComm: a GPU per rank
inline constexpr std::string_view kStagedBackend = "staged";  // StagedComm: device memory through pinned host memory

// Header only, so that the config library (which does not link MPI) reads
// communication.device_backend's choices from the table.
inline constexpr CommBackend kCommBackends[] = {
    {kMpiBackend, false},
    {kNcclBackend, true},
    {kStagedBackend, true},
};

inline std::span<const CommBackend> comm_backends() { return kCommBackends; }

// The row of `name`; nullptr when none has it ("auto" is a choice, not a back end).
inline const CommBackend* find_comm_backend(std::string_view name) {
  for (const CommBackend& b : kCommBackends)
    if (b.name == name) return &b;
  return nullptr;
}

// "auto", then every back end (device_only: those with device memory), as "auto, mpi, nccl or
// staged"; quoted: each in double quotes.
inline std::string comm_backend_choices(bool device_only, bool quoted) {
  std::vector<std::string_view> names = {"auto"};
  for (const CommBackend& b : kCommBackends)
    if (!device_only || b.device_memory) names.push_back(b.name);
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += quoted ? "\"" + std::string(names[i]) + "\"" : std::string(names[i]);
  }
  return out;
}

}  // namespace ds
