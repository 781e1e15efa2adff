#include "terminal.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "ds/core/env.h"

namespace ds::train {

namespace {

// Where process `pid` ("self" or a number) writes its stdout; empty when unreadable.
std::string stdout_target(const std::string& pid) {
  std::error_code ec;
  auto t = std::filesystem::read_symlink("/proc/" + pid + "/fd/1", ec).string();
  return ec ? std::string() : t;
}

std::string parent_pid(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string line;
  std::getline(in, line);
  const auto close = line.rfind(')');  // "pid (comm) state ppid ..."
  if (close == std::string::npos) return std::string();
  std::istringstream rest(line.substr(close + 1));
  std::string state, ppid;
  rest >> state >> ppid;
  return ppid;
}

}  // namespace

// Under a launcher we walk up the process tree past everything writing to our pty (wrappers
// such as `time`) to the launcher (mpirun or its daemon) and look at where it writes.
bool stdout_is_terminal() {
  if (!::isatty(STDOUT_FILENO)) return false;
  const bool launched = env::external("OMPI_COMM_WORLD_SIZE") || env::external("PMI_SIZE") ||
                        env::external("PMIX_RANK") || env::external("SLURM_STEP_ID");
  if (!launched) return true;
  const std::string mine = stdout_target("self");
  if (mine.empty()) return true;  // cannot tell: trust isatty
  std::string pid = std::to_string(::getppid());
  for (int depth = 0; depth < 16 && !pid.empty() && pid != "0" && pid != "1"; ++depth) {
    const std::string theirs = stdout_target(pid);
    if (theirs.empty()) return true;
    if (theirs != mine) return theirs.rfind("/dev/pts/", 0) == 0 || theirs.rfind("/dev/tty", 0) == 0;
    pid = parent_pid(pid);
  }
  return true;
}

}  // namespace ds::train
