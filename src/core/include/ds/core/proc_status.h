// The process's memory as the kernel counts it, from /proc/self/status (Linux): the training
// summary's and the ZeRO benchmark's peak resident memory read it the same way.
#pragma once

#include <istream>
#include <optional>
#include <string_view>

namespace ds {

// The number on the "<key>:" line of a /proc/<pid>/status text (e.g. "VmHWM:   123 kB" ->
// 123; memory lines are in kB), or nullopt when no line has that key or it holds no number.
std::optional<double> proc_status_value(std::istream& status, std::string_view key);

// This process's peak resident set size (VmHWM), MiB; nullopt where /proc/self/status cannot
// be read or has no VmHWM line (not Linux).
std::optional<double> peak_resident_mib();

}  // namespace ds
