// Process control for dsrun: start the engine in its own process group, forward
// SIGINT/SIGTERM/SIGHUP to that group, escalate to SIGKILL, return the exit status.
#pragma once

#include <string>
#include <vector>

namespace dsrun {

// Runs argv (PATH lookup) with the current environment; returns the exit code: the child's
// code, 128+signal when it died of a signal, or 128+signal when dsrun itself was signalled.
// `grace_seconds`: after forwarding a signal, how long before SIGKILL goes to the group.
int run_supervised(const std::vector<std::string>& argv, int grace_seconds);

// Runs argv with stdin from /dev/null, stdout+stderr captured; returns the exit code.
int run_capture(const std::vector<std::string>& argv, std::string& output);

// True when `name` is an executable found in PATH.
bool in_path(const std::string& name);

}  // namespace dsrun
