// The host memory a job may use on this machine: MemAvailable from /proc/meminfo, or the
// memory cgroup's limit when that is lower (a container or a Slurm job step sees the whole
// machine's MemAvailable but is killed at its cgroup's limit).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace ds::train {

struct HostMemory {
  std::uint64_t bytes = 0;
  std::string source;  // where the figure comes from, for messages: "MemAvailable in /proc/meminfo"
};

// The lower of MemAvailable and the limits of this process's memory cgroup and its ancestors
// (cgroup v2 memory.max, v1 memory.limit_in_bytes; "max" and v1's huge "no limit" value are
// no limit). nullopt when neither can be read (not Linux). `root` prefixes every path read
// ("/proc/meminfo" is read as root + "/proc/meminfo"), so tests can give a tree of their own.
std::optional<HostMemory> available_host_memory(const std::string& root = "");

}  // namespace ds::train
