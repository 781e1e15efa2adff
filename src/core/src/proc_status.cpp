#include "ds/core/proc_status.h"

#include <cstdlib>
#include <fstream>
#include <string>

namespace ds {

std::optional<double> proc_status_value(std::istream& status, std::string_view key) {
  std::string line;
  while (std::getline(status, line)) {
    if (line.size() <= key.size() || line.compare(0, key.size(), key) != 0 || line[key.size()] != ':') continue;
    const char* begin = line.c_str() + key.size() + 1;
    char* end = nullptr;
    const double v = std::strtod(begin, &end);
    if (end == begin) return std::nullopt;
    return v;
  }
  return std::nullopt;
}

std::optional<double> peak_resident_mib() {
  std::ifstream f("/proc/self/status");
  const auto kib = proc_status_value(f, "VmHWM");
  if (!kib) return std::nullopt;
  return *kib / 1024.0;
}

}  // namespace ds
