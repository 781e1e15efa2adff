#include "host_memory.h"

#include <charconv>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "ds/core/proc_status.h"

namespace fs = std::filesystem;

namespace ds::train {

namespace {

// A cgroup limit file's value in bytes; nullopt for no limit ("max"; cgroup v1 writes no
// limit as a number near 2^63) or when the file cannot be read.
std::optional<std::uint64_t> limit_value(const fs::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!std::getline(in, text) || text.empty() || text == "max") return std::nullopt;
  std::uint64_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  if (v >= (std::uint64_t(1) << 60)) return std::nullopt;
  return v;
}

struct MemoryCgroup {
  fs::path mount;    // the hierarchy's directory
  std::string file;  // its limit file
  fs::path path;     // this process's cgroup inside it, relative
};

// Whether a comma-separated controller list ("cpu,cpuacct") names the memory controller.
bool lists_memory(std::string_view controllers) {
  while (!controllers.empty()) {
    const auto comma = controllers.find(',');
    if (controllers.substr(0, comma) == "memory") return true;
    if (comma == std::string_view::npos) break;
    controllers.remove_prefix(comma + 1);
  }
  return false;
}

// This process's memory cgroup, from /proc/self/cgroup ("hierarchy-ID:controllers:path" lines):
// the v1 memory controller's line when there is one (it holds the limit on a hybrid system),
// else the v2 line ("0::path").
std::optional<MemoryCgroup> memory_cgroup(const std::string& root) {
  std::ifstream in(root + "/proc/self/cgroup");
  std::optional<MemoryCgroup> v2;
  for (std::string line; std::getline(in, line);) {
    const auto a = line.find(':');
    const auto b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string_view controllers = std::string_view(line).substr(a + 1, b - a - 1);
    const fs::path path = fs::path(line.substr(b + 1)).relative_path();
    if (lists_memory(controllers))
      return MemoryCgroup{root + "/sys/fs/cgroup/memory", "memory.limit_in_bytes", path};
    if (controllers.empty() && line.compare(0, a, "0") == 0) v2 = MemoryCgroup{root + "/sys/fs/cgroup", "memory.max", path};
  }
  return v2;
}

// The lowest limit from the cgroup up to its hierarchy's top (a parent's limit caps its
// children); a path leaving the hierarchy (another cgroup namespace) reads the top only.
std::optional<HostMemory> cgroup_limit(const std::string& root) {
  const auto cg = memory_cgroup(root);
  if (!cg) return std::nullopt;
  fs::path rel = cg->path;
  for (const auto& part : rel)
    if (part == "..") rel.clear();
  std::optional<HostMemory> lowest;
  for (fs::path p = rel;; p = p.parent_path()) {
    const fs::path file = (p.empty() ? cg->mount : cg->mount / p) / cg->file;
    if (const auto v = limit_value(file); v && (!lowest || *v < lowest->bytes))
      lowest = HostMemory{*v, "the memory cgroup's limit in " + file.string()};
    if (p.empty()) break;
  }
  return lowest;
}

}  // namespace

std::optional<HostMemory> available_host_memory(const std::string& root) {
  std::optional<HostMemory> best;
  std::ifstream meminfo(root + "/proc/meminfo");
  if (const auto kib = proc_status_value(meminfo, "MemAvailable"))
    best = HostMemory{std::uint64_t(*kib) * 1024, "MemAvailable in /proc/meminfo"};
  if (const auto limit = cgroup_limit(root); limit && (!best || limit->bytes < best->bytes)) best = limit;
  return best;
}

}  // namespace ds::train
