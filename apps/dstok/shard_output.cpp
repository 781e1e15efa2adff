#include "shard_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "ds/core/error.h"
#include "shard_file.h"

namespace fs = std::filesystem;

namespace ds::tools {

namespace {

// A directory entry that is a shard of the prefix: `base`_<6 or more digits>.bin.
bool is_shard_name(std::string_view name, std::string_view base) {
  if (!name.starts_with(base)) return false;
  name.remove_prefix(base.size());
  if (!name.starts_with('_') || !name.ends_with(".bin")) return false;
  const std::string_view digits = name.substr(1, name.size() - 5);
  return digits.size() >= 6 && std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

struct Existing {
  std::string name;  // file name in the directory
  fs::file_type type;  // not following a symlink
};

// The prefix's shards now in `dir`, sorted by name.
std::vector<Existing> existing_shards(const std::string& dir, const std::string& base) {
  std::vector<Existing> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (is_shard_name(name, base)) out.push_back({name, it->symlink_status(ec).type()});
  }
  DS_CHECK(!ec, "cannot list directory " << dir << ": " << ec.message());
  std::sort(out.begin(), out.end(), [](const Existing& a, const Existing& b) { return a.name < b.name; });
  return out;
}

// Creates a new hidden file for `name` in `dir` (O_EXCL: an existing name, symlink or not, is
// never opened); returns the descriptor and its path.
std::pair<int, std::string> create_temporary(const std::string& dir, const std::string& name, const std::string& prefix) {
  std::string path = (fs::path(dir) / ("." + name + ".XXXXXX")).string();
  const int fd = ::mkostemp(path.data(), O_CLOEXEC);
  DS_CHECK(fd >= 0, "--output " << prefix << ": cannot create a file in directory " << dir << ": " << std::strerror(errno));
  return {fd, path};
}

// The mode a plain create would give (0666 less the umask); mkostemp makes 0600.
mode_t created_file_mode() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return 0666 & ~mask;
}

}  // namespace

std::string shard_path(const std::string& prefix, std::size_t index) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "_%06zu.bin", index);
  return prefix + suffix;
}

ShardOutput::ShardOutput(const std::string& prefix, bool force) : prefix_(prefix), force_(force) {
  const fs::path parent = fs::path(prefix).parent_path();
  std::error_code ec;
  DS_CHECK(parent.empty() || fs::is_directory(parent, ec),
           "--output " << prefix << ": directory " << parent.string() << " does not exist");
  DS_CHECK(!prefix.empty() && prefix.back() != '/',
           "--output " << prefix << ": give a file name prefix (shards are PREFIX_000000.bin, ...)");
  dir_ = parent.empty() ? "." : parent.string();
  // A read-only or foreign directory is found now, not after the encoding.
  const std::string base = fs::path(prefix).filename().string();
  const auto [fd, probe] = create_temporary(dir_, base, prefix);
  ::close(fd);
  ::unlink(probe.c_str());

  const std::vector<Existing> shards = existing_shards(dir_, base);
  for (const Existing& s : shards)
    DS_CHECK(s.type != fs::file_type::directory, "--output " << prefix << ": " << (fs::path(dir_) / s.name).string()
                                                             << " is a directory, not a shard: move it away");
  if (shards.empty() || force) return;
  const auto link = std::find_if(shards.begin(), shards.end(),
                                 [](const Existing& s) { return s.type == fs::file_type::symlink; });
  const Existing& named = link != shards.end() ? *link : shards.front();
  DS_THROW("--output " << prefix << ": " << (fs::path(dir_) / named.name).string()
                       << (link != shards.end() ? " (a symbolic link)" : "") << " already exists"
                       << (shards.size() > 1 ? " (" + std::to_string(shards.size()) + " shards of this prefix exist)" : "")
                       << ": give --force to replace the prefix's shards, or another --output");
}

ShardOutput::~ShardOutput() {
  for (const auto& [tmp, final_path] : pending_)
    if (!tmp.empty()) ::unlink(tmp.c_str());
}

void ShardOutput::check_space(std::uint64_t bytes, const std::string& what) const {
  struct statvfs vfs {};
  if (::statvfs(dir_.c_str(), &vfs) != 0) return;  // unknown: a failed write still cleans up
  const std::uint64_t free_bytes = std::uint64_t(vfs.f_bavail) * std::uint64_t(vfs.f_frsize);
  DS_CHECK(bytes <= free_bytes, "--output " << prefix_ << ": the shards need " << bytes << " bytes (" << what
                                            << ") but the file system of " << dir_ << " has " << free_bytes
                                            << " bytes free");
}

std::string ShardOutput::write(std::span<const std::int32_t> tokens, int version) {
  const std::string final_path = shard_path(prefix_, pending_.size());
  const auto [fd, tmp] = create_temporary(dir_, fs::path(final_path).filename().string(), prefix_);
  pending_.emplace_back(tmp, final_path);  // from here the destructor removes it on any error
  try {
    write_shard(fd, final_path, tokens, version);
    DS_CHECK(::fchmod(fd, created_file_mode()) == 0 && ::fsync(fd) == 0,
             "writing " << final_path << " failed: " << std::strerror(errno));
  } catch (...) {
    ::close(fd);
    throw;
  }
  DS_CHECK(::close(fd) == 0, "writing " << final_path << " failed: " << std::strerror(errno));
  return final_path;
}

void ShardOutput::commit() {
  std::unordered_set<std::string> written;
  for (auto& [tmp, final_path] : pending_) {
    DS_CHECK(::rename(tmp.c_str(), final_path.c_str()) == 0,
             "cannot rename " << tmp << " to " << final_path << ": " << std::strerror(errno));
    tmp.clear();
    written.insert(fs::path(final_path).filename().string());
  }
  if (!force_) return;
  for (const Existing& s : existing_shards(dir_, fs::path(prefix_).filename().string())) {
    if (written.count(s.name)) continue;
    const std::string path = (fs::path(dir_) / s.name).string();
    DS_CHECK(::unlink(path.c_str()) == 0 || errno == ENOENT,
             "cannot remove the older shard " << path << ": " << std::strerror(errno));
  }
}

}  // namespace ds::tools
