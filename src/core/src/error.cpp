#include "ds/core/error.h"

#include <atomic>
#include <cstring>

namespace ds {

namespace {
std::atomic<int> g_rank{-1};

const char* short_path(const char* file) {
  // Keep the path from the project's top folders on, so messages stay one line.
  for (const char* top : {"src/", "mpi/", "io/", "apps/", "tests/", "bench/"}) {
    if (const char* p = std::strstr(file, top)) return p;
  }
  return file;
}
}  // namespace

Error::Error(const std::string& message, const std::string& location)
    : std::runtime_error(location.empty() ? message : message + " [" + location + "]"), message_(message) {}

int process_rank() { return g_rank.load(std::memory_order_relaxed); }
void set_process_rank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

void throw_error(const std::string& message, const char* file, int line) {
  std::ostringstream os;
  os << short_path(file) << ":" << line;
  if (process_rank() >= 0) os << ", rank " << process_rank();
  throw Error(message, os.str());
}

}  // namespace ds
