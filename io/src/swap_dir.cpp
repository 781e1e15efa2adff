// SwapDir (ds/io/swap_dir.h): a rank's swap directory, and the removal of the ones that
// killed jobs left behind.
//
// Races it is built for: the ranks of a node create their directories under the same
// dstrain-swap at once, and each also cleans its siblings. A creator makes its directory,
// then the lock file, then takes the lock without blocking; a cleaner removes a sibling only
// while it holds that sibling's lock. So a cleaner that comes between a creator's open and
// flock wins the lock, and the creator, whose flock then fails (or whose lock file is gone
// by the time it checks), starts again; a directory whose lock file does not exist yet is
// left alone unless it is older than kNoLockGraceSeconds.
#include "ds/io/swap_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <thread>
#include <utility>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/log.h"

namespace ds::io {

namespace {

constexpr const char* kBaseName = "dstrain-swap";
constexpr const char* kLockName = "lock";

std::string host_name() {
  char b[256] = {};
  if (::gethostname(b, sizeof b - 1) != 0 || b[0] == '\0') return "localhost";
  return b;
}

std::string mib(std::size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", double(bytes) / double(std::size_t(1) << 20));
  return s;
}

std::string gib(std::size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", double(bytes) / double(std::size_t(1) << 30));
  return s;
}

std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (const dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

// Removes a swap directory (files only: nothing here makes subdirectories) with the lock file
// last, so that the directory stays recognisable as taken until it is gone. Returns whether
// the directory is gone; *freed (when given) gets the bytes of the files removed.
bool remove_swap_dir(const std::string& dir, std::size_t* freed_out = nullptr) {
  std::size_t freed = 0;
  for (const auto& n : entries(dir)) {
    if (n == kLockName) continue;
    const std::string p = dir + "/" + n;
    struct stat st {};
    if (::lstat(p.c_str(), &st) == 0) freed += std::size_t(st.st_blocks) * 512;
    ::unlink(p.c_str());
  }
  ::unlink((dir + "/" + kLockName).c_str());
  if (freed_out) *freed_out = freed;
  return ::rmdir(dir.c_str()) == 0 || errno == ENOENT;
}

// "<host>-<pid>-rank<R>" for this host (siblings of other hosts on a shared file system are
// never touched: their processes cannot be seen from here).
bool swap_dir_name_of_host(const std::string& name, const std::string& host) {
  if (name.size() <= host.size() + 1 || name.compare(0, host.size(), host) != 0 || name[host.size()] != '-') return false;
  const std::string rest = name.substr(host.size() + 1);
  std::size_t i = 0;
  while (i < rest.size() && std::isdigit(static_cast<unsigned char>(rest[i]))) ++i;
  if (i == 0 || rest.compare(i, 5, "-rank") != 0) return false;
  std::size_t j = i + 5;
  if (j == rest.size()) return false;
  for (; j < rest.size(); ++j)
    if (!std::isdigit(static_cast<unsigned char>(rest[j]))) return false;
  return true;
}

bool lock_unsupported(int err) { return err == ENOSYS || err == EOPNOTSUPP || err == ENOLCK || err == EINVAL; }

// Removes dir when the process that made it is gone; returns whether it did.
bool remove_if_stale(const std::string& dir) {
  const std::string lock = dir + "/" + kLockName;
  const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) return false;
    // No lock file: a directory being created right now, or one whose creator died before
    // making it. Only the old ones are taken.
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
    if (std::time(nullptr) - st.st_mtime < SwapDir::kNoLockGraceSeconds) return false;
    if (::access(lock.c_str(), F_OK) == 0) return false;  // its lock appeared meanwhile
    std::size_t freed = 0;
    if (!remove_swap_dir(dir, &freed)) return false;  // another user's, say
    DS_WARN("removed stale swap directory " << dir << " (no lock file, older than " << SwapDir::kNoLockGraceSeconds
                                            << " s; " << mib(freed) << " MiB freed)");
    return true;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // a live process holds it (or another cleaner)
    ::close(fd);
    return false;
  }
  // Ours now: the lock file we hold must still be the directory's (not one a second cleaner
  // already removed).
  struct stat a {}, b {};
  const bool same = ::fstat(fd, &a) == 0 && ::stat(lock.c_str(), &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev;
  std::size_t freed = 0;
  const bool removed = same && remove_swap_dir(dir, &freed);
  ::close(fd);
  if (removed)
    DS_WARN("removed stale swap directory " << dir << " (its process is gone; " << mib(freed) << " MiB freed)");
  return removed;
}

}  // namespace

SwapDir::SwapDir(const std::string& nvme_path, const std::string& key, int rank, std::size_t need_bytes) {
  // (1) nvme_path itself.
  struct stat st {};
  if (::stat(nvme_path.c_str(), &st) != 0) {
    if (errno == ENOENT) DS_THROW(key << " " << nvme_path << " does not exist");
    DS_THROW(key << " " << nvme_path << ": cannot access it (" << std::strerror(errno) << ")");
  }
  DS_CHECK(S_ISDIR(st.st_mode), key << " " << nvme_path << " is not a directory");
  const std::string base = nvme_path + (nvme_path.ends_with('/') ? "" : "/") + kBaseName;
  if (::mkdir(base.c_str(), 0777) == 0) {
    // Shared like /tmp: every user's jobs make their directories in it, and the sticky bit
    // keeps them from removing each other's (other users' locks cannot even be opened).
    ::chmod(base.c_str(), 01777);
  } else if (errno != EEXIST) {  // EEXIST: another rank was first
    DS_THROW(key << " " << nvme_path << " is not writable (" << std::strerror(errno) << ")");
  }
  if (::stat(base.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    DS_THROW(key << " " << nvme_path << ": " << base << " exists and is not a directory");
  if (::access(base.c_str(), W_OK | X_OK) != 0)
    DS_THROW(key << " " << nvme_path << " is not writable (" << std::strerror(errno) << ")");

  // (2) what killed jobs of this host left.
  const std::string host = host_name();
  const std::string name = host + "-" + std::to_string(::getpid()) + "-rank" + std::to_string(rank);
  for (const auto& n : entries(base))
    if (n != name && swap_dir_name_of_host(n, host)) remove_if_stale(base + "/" + n);

  // (3) room for the files.
  struct statvfs vfs {};
  if (::statvfs(base.c_str(), &vfs) == 0) {
    const std::size_t free_bytes = std::size_t(vfs.f_bavail) * std::size_t(vfs.f_frsize);
    const std::size_t needed = need_bytes + kFreeMargin;
    if (free_bytes < needed)
      DS_THROW(key << " " << nvme_path << ": " << gib(needed) << " GiB needed for the swap files, " << gib(free_bytes)
                   << " GiB free");
  }

  // Our own directory: mkdir, lock file, flock without blocking, then check that the lock
  // file is still the directory's (see the top of the file). A directory of the same name
  // is a dead process's with our pid (containers reuse pids) unless its lock is held.
  const std::string dir = base + "/" + name;
  for (int attempt = 0;; ++attempt) {
    DS_CHECK(attempt < 100, key << " " << nvme_path << ": cannot set up swap directory " << dir
                                << " (its lock kept being taken)");
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (::mkdir(dir.c_str(), 0700) != 0) {
      if (errno != EEXIST) DS_THROW(key << " " << nvme_path << " is not writable (" << std::strerror(errno) << ")");
      if (::access((dir + "/" + kLockName).c_str(), F_OK) == 0 && !remove_if_stale(dir))
        DS_THROW(key << " " << nvme_path << ": swap directory " << dir
                     << " is in use (a second SwapDir for rank " << rank << " in this process)");
      if (::access((dir + "/" + kLockName).c_str(), F_OK) != 0) remove_swap_dir(dir);
      continue;
    }
    const std::string lock = dir + "/" + kLockName;
    const int fd = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) continue;  // a cleaner removed the directory under us
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      if (lock_unsupported(err)) {
        DS_WARN(key << " " << nvme_path << ": the file system has no flock (" << std::strerror(err)
                    << "); swap directories of killed jobs cannot be told from live ones and are not removed");
      } else {
        ::close(fd);  // a cleaner has it and will remove the directory
        continue;
      }
    }
    struct stat a {}, b {};
    if (::fstat(fd, &a) != 0 || ::stat(lock.c_str(), &b) != 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev) {
      ::close(fd);
      continue;
    }
    path_ = dir;
    lock_fd_ = fd;
    break;
  }
}

void SwapDir::remove_now() noexcept {
  if (path_.empty()) return;
  remove_swap_dir(path_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // the lock goes last: until then a cleaner leaves it
  lock_fd_ = -1;
  path_.clear();
}

SwapDir::~SwapDir() { remove_now(); }

SwapDir::SwapDir(SwapDir&& o) noexcept : path_(std::move(o.path_)), lock_fd_(std::exchange(o.lock_fd_, -1)) {
  o.path_.clear();
}

SwapDir& SwapDir::operator=(SwapDir&& o) noexcept {
  if (this != &o) {
    remove_now();
    path_ = std::move(o.path_);
    o.path_.clear();
    lock_fd_ = std::exchange(o.lock_fd_, -1);
  }
  return *this;
}

std::string SwapDir::file(const std::string& name) const { return path_ + "/" + name; }

}  // namespace ds::io
