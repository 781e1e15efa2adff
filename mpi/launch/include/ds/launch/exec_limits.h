// The kernel's size limits for one exec, checked before dsrun starts the engine: a job whose
// exported variables do not fit would otherwise fail with a bare E2BIG that names nothing.
#pragma once

#include <cstddef>

#include "ds/launch/command.h"
#include "ds/launch/env_file.h"

namespace ds::launch {

struct ExecLimits {
  std::size_t max_arg_strlen = 0;  // one argv or envp string, its terminating NUL included
  std::size_t arg_max = 0;         // all strings (NULs included) plus their pointers
};

// Linux: MAX_ARG_STRLEN = 32 pages; ARG_MAX = sysconf(_SC_ARG_MAX) (a quarter of the stack
// rlimit, at least 32 pages), capped at the kernel's 6 MiB (3/4 of its 8 MiB stack default).
ExecLimits system_exec_limits();

// Throws when executing cmd.argv with `environ` as environment would fail with E2BIG:
//  - an exported variable whose NAME=VALUE is over the one-string limit (it travels as one
//    string: `-x NAME=VALUE`, `env NAME=VALUE`, and in every rank's environment), named;
//  - any other argument over that limit (program argument, world_info, launcher_args);
//  - everything together over arg_max, naming the largest variable.
void check_exec_size(const Command& cmd, const EnvList& environ, const ExecLimits& limits);

}  // namespace ds::launch
