// The one way the command-line tools end on a command-line parse error.
//
// CLI11's own App::exit() prints its message and returns its own exit codes (105-109 for a
// missing or unexpected argument, a failed check, ...), which scripts cannot tell from a
// crash. The tools instead print one line "<tool>: error: <what> (see <tool> --help)" and
// exit 2 (bad usage), the same as train; --help and --version still print and exit 0.
#pragma once

#include <iostream>
#include <string_view>

#include <CLI/CLI.hpp>

namespace ds::tools {

inline constexpr int kUsageExitCode = 2;

inline int usage_exit(const CLI::App& app, const CLI::ParseError& e, std::string_view tool) {
  if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) return app.exit(e);  // --help, --version
  std::cerr << tool << ": error: " << e.what() << " (see " << tool << " --help)" << std::endl;
  return kUsageExitCode;
}

}  // namespace ds::tools
