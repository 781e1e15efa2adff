#include "save_claim.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/log.h"

namespace fs = std::filesystem;

namespace ds::io::detail {

namespace {

constexpr const char* kRecordHeader = "dstrain-save 1";

std::string read_small_file(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

std::string host_name() {
  char b[256] = {};
  if (::gethostname(b, sizeof b - 1) != 0) return "?";
  return b;
}

std::string boot_id() {
  std::string s = read_small_file("/proc/sys/kernel/random/boot_id");
  return s.empty() ? "?" : s;
}

// Field 22 of /proc/<pid>/stat: the process start time in clock ticks after boot (with the
// pid, it names one process: pids are reused, start times are not). "" when not readable.
std::string start_time(const std::string& pid) {
  std::string line = read_small_file("/proc/" + pid + "/stat");
  const auto close = line.rfind(')');
  if (close == std::string::npos) return "";
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && (rest >> field); ++i) {
    if (i == 22) return field;
  }
  return "";
}

std::string my_record() {
  std::ostringstream os;
  const std::string pid = std::to_string(::getpid());
  os << kRecordHeader << "\npid " << pid << "\nhost " << host_name() << "\nboot " << boot_id() << "\nstart "
     << start_time(pid) << "\n";
  return os.str();
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

SaveClaim lock_and_record(int fd, const std::string& marker) {
  auto claim = std::make_shared<Fd>();
  claim->fd = fd;
  // No lock support (some network filesystems): the record alone then marks the writer.
  if (::flock(fd, LOCK_EX) != 0 && errno != ENOLCK && errno != EOPNOTSUPP && errno != ENOSYS)
    DS_THROW("cannot lock " << marker << ": " << std::strerror(errno));
  const std::string rec = my_record();
  DS_CHECK(::ftruncate(fd, 0) == 0 && ::pwrite(fd, rec.data(), rec.size(), 0) == ssize_t(rec.size()) && ::fsync(fd) == 0,
           "cannot write " << marker << ": " << std::strerror(errno));
  return claim;
}

// The marker's writer is provably gone. On true, *lock holds the marker's fd, locked, so that no
// other cleaner removes the directory at the same time.
bool writer_gone(const fs::path& dir, Fd& lock) {
  const std::string marker = (dir / kSaveMarker).string();
  lock.fd = ::open(marker.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (lock.fd < 0) return false;  // no marker: not a dstrain save, or one just being created
  struct stat st{};
  if (::fstat(lock.fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > 4096) return false;
  bool lock_free = true;
  if (::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) return false;  // the writer holds it: a save in progress
    lock_free = errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS;  // no locks here: the record decides
    if (!lock_free) return false;
  }
  std::string text(std::size_t(st.st_size), '\0');
  if (::pread(lock.fd, text.data(), text.size(), 0) != ssize_t(text.size())) return false;
  std::map<std::string, std::string> rec;
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || line != kRecordHeader) return false;  // partly written: keep
  while (std::getline(in, line)) {
    auto sp = line.find(' ');
    if (sp != std::string::npos) rec[line.substr(0, sp)] = line.substr(sp + 1);
  }
  for (const char* k : {"pid", "host", "boot", "start"})
    if (!rec.count(k) || rec[k].empty()) return false;
  if (rec["host"] != host_name()) {
    DS_INFO("leaving " << dir.string() << ": its save was started on host " << rec["host"] << " (pid " << rec["pid"]
                       << "), which this process cannot check; remove it by hand once that job has ended");
    return false;
  }
  if (rec["boot"] != boot_id()) return true;  // this host rebooted since: the writer is gone
  if (rec["pid"].find_first_not_of("0123456789") != std::string::npos) return false;
  const std::string now = start_time(rec["pid"]);
  return now.empty() || now != rec["start"];  // no such process, or the pid was reused
}

}  // namespace

std::string writer_description() {
  std::string s = "pid " + std::to_string(::getpid()) + " on host " + host_name();
  if (auto job = env::external("SLURM_JOB_ID")) s += ", Slurm job " + *job;
  return s;
}

bool is_tmp_dir_name(std::string_view name) {
  constexpr std::string_view kSep = ".tmp-";
  constexpr std::size_t kHex = 12;
  if (name.size() <= kSep.size() + kHex) return false;
  const std::size_t at = name.size() - kHex - kSep.size();
  if (name.substr(at, kSep.size()) != kSep) return false;
  for (char c : name.substr(at + kSep.size()))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

SaveClaim create_claimed_dir(const std::string& dir) {
  DS_CHECK(::mkdir(dir.c_str(), 0755) == 0, "cannot create " << dir << ": " << std::strerror(errno));
  const std::string marker = (fs::path(dir) / kSaveMarker).string();
  int fd = ::open(marker.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "cannot create " << marker << ": " << std::strerror(errno));
  return lock_and_record(fd, marker);
}

SaveClaim claim_existing_dir(const std::string& dir) {
  const std::string marker = (fs::path(dir) / kSaveMarker).string();
  int fd = ::open(marker.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "cannot create " << marker << ": " << std::strerror(errno));
  return lock_and_record(fd, marker);
}

int remove_abandoned_tmp_dirs(const std::string& save_dir) {
  int n = 0;
  std::error_code ec;
  if (!fs::is_directory(save_dir, ec)) return 0;
  for (const auto& e : fs::directory_iterator(save_dir, ec)) {
    if (!is_tmp_dir_name(e.path().filename().string())) continue;
    std::error_code sec;
    if (!fs::is_directory(e.symlink_status(sec)) || sec) continue;  // a symlink or a file: not ours
    Fd lock;
    if (!writer_gone(e.path(), lock)) continue;
    std::error_code rec;
    fs::remove_all(e.path(), rec);
    if (!rec) ++n;
  }
  return n;
}

}  // namespace ds::io::detail
