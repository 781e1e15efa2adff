#include "save_dir_check.h"

#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "ds/core/error.h"

namespace fs = std::filesystem;

namespace ds::train {

namespace {

std::string mib(std::uint64_t bytes) {
  char b[64];
  std::snprintf(b, sizeof b, "%.1f MiB", double(bytes) / double(1 << 20));
  return b;
}

// N for an entry named "global_step<N>" (digits only), else -1.
std::int64_t step_of_tag(std::string_view name) {
  constexpr std::string_view kPrefix = "global_step";
  if (name.substr(0, kPrefix.size()) != kPrefix || name.size() == kPrefix.size() || name.size() > kPrefix.size() + 18)
    return -1;
  std::int64_t n = 0;
  for (char c : name.substr(kPrefix.size())) {
    if (c < '0' || c > '9') return -1;
    n = n * 10 + (c - '0');
  }
  return n;
}

// Device and inode of `path` (symlinks followed), or nothing when it cannot be stat'ed.
std::optional<std::pair<dev_t, ino_t>> file_identity(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return std::make_pair(st.st_dev, st.st_ino);
}

}  // namespace

void check_model_save_target(const std::string& output, const std::string& init_from) {
  const auto out = file_identity(output);
  if (!out) return;  // a new file replaces nothing
  std::vector<std::string> inputs = {init_from};
  std::error_code ec;
  if (fs::is_directory(init_from, ec))
    for (const auto& e : fs::directory_iterator(init_from, ec)) inputs.push_back(e.path().string());
  for (const std::string& in : inputs) {
    if (file_identity(in) != out) continue;
    DS_THROW("the model save (zero_optimization.stage3_gather_16bit_weights_on_model_save) would replace "
             << output << ", which is " << (in == init_from ? "" : in + " in ") << "this run's --init_from "
             << init_from << ": give another --save_dir, or start from a copy of the weights");
  }
}

void check_save_dir(const std::string& dir) {
  DS_CHECK(!dir.empty(), "--save_dir is empty: give a checkpoint directory (or leave --save_dir out to save nothing)");
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(dir, ec);
  if (fs::is_symlink(link) && !fs::exists(dir, ec)) {
    const fs::path target = fs::read_symlink(dir, ec);
    DS_THROW("--save_dir " << dir << " is a symbolic link to '" << target.string() << "', which does not exist");
  }
  if (fs::exists(dir, ec)) {
    DS_CHECK(fs::is_directory(dir, ec), "--save_dir " << dir << " exists and is not a directory");
  } else {
    // The nearest existing ancestor must be a directory we can create entries in.
    fs::path p = fs::path(dir).lexically_normal();
    fs::path up = p.parent_path();
    while (!up.empty() && !fs::exists(up, ec) && up != up.parent_path()) up = up.parent_path();
    if (!up.empty() && fs::exists(up, ec))
      DS_CHECK(fs::is_directory(up, ec), "--save_dir " << dir << " cannot be created: " << up.string() << " is not a directory");
    fs::create_directories(dir, ec);
    DS_CHECK(!ec || fs::is_directory(dir), "--save_dir " << dir << " cannot be created: " << ec.message());
  }
  // Writable: create (and remove) a file, which is what every save does; access() would not
  // see a read-only mount for root in every case, nor quotas.
  std::string probe = (fs::path(dir) / ".dstrain-write-test-XXXXXX").string();
  std::vector<char> name(probe.begin(), probe.end());
  name.push_back('\0');
  const int fd = ::mkstemp(name.data());
  DS_CHECK(fd >= 0, "--save_dir " << dir << " is not writable: " << std::strerror(errno));
  ::close(fd);
  ::unlink(name.data());
}

void check_save_plan(const std::string& dir, const SavePlan& plan) {
  if (plan.start_step >= plan.total_steps) return;  // nothing to train, nothing saved
  auto saved_at = [&](std::int64_t n) {
    return n > plan.start_step && n <= plan.total_steps &&
           (n == plan.total_steps || (plan.save_interval > 0 && n % plan.save_interval == 0));
  };
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const std::int64_t n = step_of_tag(name);
    if (n < 0 || !saved_at(n)) continue;
    DS_THROW("--save_dir " << dir << " already holds checkpoint " << name << ", which this run would save again at step "
                           << n << " (steps " << plan.start_step + 1 << "-" << plan.total_steps
                           << "; a checkpoint is never overwritten): use another --save_dir, or move " << name
                           << " away");
  }
  struct statvfs st{};
  if (::statvfs(dir.c_str(), &st) == 0) {
    const std::uint64_t avail = std::uint64_t(st.f_bavail) * std::uint64_t(st.f_frsize);
    DS_CHECK(avail >= plan.checkpoint_bytes, "--save_dir " << dir << " has " << mib(avail)
                                                           << " free; a checkpoint of this run needs about "
                                                           << mib(plan.checkpoint_bytes));
  }
}

}  // namespace ds::train
