// The communicator back-end table (comm_backends.h).
#include "ds/mpi/comm_backends.h"

#include <vector>

namespace ds {

namespace {
constexpr CommBackend kBackends[] = {
    {kMpiBackend, false},
    {kNcclBackend, true},
    {kStagedBackend, true},
};
}  // namespace

std::span<const CommBackend> comm_backends() { return kBackends; }

const CommBackend* find_comm_backend(std::string_view name) {
  for (const CommBackend& b : kBackends)
    if (b.name == name) return &b;
  return nullptr;
}

std::string comm_backend_choices(bool device_only, bool quoted) {
  std::vector<std::string_view> names = {"auto"};
  for (const CommBackend& b : kBackends)
    if (!device_only || b.device_memory) names.push_back(b.name);
  std::string out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or " : ", ";
    out += quoted ? "\"" + std::string(names[i]) + "\"" : std::string(names[i]);
  }
  return out;
}

}  // namespace ds
