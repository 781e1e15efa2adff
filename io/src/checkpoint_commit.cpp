// Rank 0's part of commit_save: the tmp dir put in place as <tag>, then `latest` moved. Both
// must hold against another job saving into the same directory at the same time (a shared
// save_dir, a job started twice): a tag is never replaced unless this save saw it and meant
// to, and `latest` never moves back to an older step. The protocol: docs/user/checkpoints.md.
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>

#include "checkpoint_internal.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/log.h"
#include "ds/io/h5file.h"
#include "save_claim.h"

namespace fs = std::filesystem;

namespace ds::io {

DirIdentity dir_identity(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return {};
  return {true, std::uint64_t(st.st_dev), std::uint64_t(st.st_ino)};
}

namespace detail {

void write_text_file_synced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "cannot create " << path << ": " << std::strerror(errno));
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      DS_THROW("writing " << path << " failed: " << std::strerror(err));
    }
    p += n;
    left -= std::size_t(n);
  }
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  DS_CHECK(rc == 0, "fsync of " << path << " failed: " << std::strerror(err));
}

namespace {

bool exchange_dirs(const std::string& a, const std::string& b) {
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
}

// rename() that fails with EEXIST instead of replacing `to`. Where the filesystem has no
// RENAME_NOREPLACE, plain rename(2): a directory replaces only an empty directory, and a
// committed tag is never empty.
bool rename_noreplace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return true;
  if (errno != EINVAL && errno != ENOSYS) return false;
  return ::rename(from.c_str(), to.c_str()) == 0;
}

// The manifest of a committed checkpoint directory, or nothing when it cannot be read.
std::optional<Manifest> manifest_of(const std::string& dir) {
  try {
    return parse_manifest((fs::path(dir) / kManifestFile).string());
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

[[noreturn]] void throw_tag_taken(const PendingSave& p, const char* what_happened) {
  const std::optional<Manifest> theirs = manifest_of(p.final_dir);
  const std::string who = theirs && !theirs->writer.empty() ? printable_excerpt(theirs->writer, 200)
                                                            : std::string("unknown: it records no writer");
  DS_THROW("checkpoint tag '" << p.tag << "' in " << p.save_dir << " was " << what_happened
                              << " by another writer (" << who << ") after this save checked it; this save is not "
                              << "committed, and that checkpoint and 'latest' are left as they are. Two jobs saving "
                              << "into one directory need different tags or directories");
}

// The overwrite of the copy begin_save saw (p.tag_seen), which `now` still is: exchanged,
// then checked again, because another writer may replace <tag> between the look and the
// exchange; then that writer's copy is swapped back and this save fails.
void exchange_seen_copy(const PendingSave& p) {
  // Marked and locked first, so that the old copy, which sits under the tmp name until it is
  // removed, is cleaned as an abandoned tmp dir if this process dies before removing it.
  SaveClaim old_copy = claim_existing_dir(p.final_dir);
  DS_CHECK(exchange_dirs(p.tmp_dir, p.final_dir),
           "cannot replace " << p.final_dir << " (renameat2 RENAME_EXCHANGE): " << std::strerror(errno));
  if (dir_identity(p.tmp_dir) != p.tag_seen) {
    const bool back = exchange_dirs(p.tmp_dir, p.final_dir);
    DS_CHECK(back, "checkpoint tag '" << p.tag << "' in " << p.save_dir << " was replaced by another writer while "
                                      << "this save replaced it, and swapping it back failed ("
                                      << std::strerror(errno) << "): that writer's copy is now " << p.tmp_dir
                                      << "; move it back to " << p.final_dir << " by hand");
    ::unlink((fs::path(p.final_dir) / kSaveMarker).c_str());  // their copy: no marker of ours
    throw_tag_taken(p, "replaced");
  }
  fsync_path(p.save_dir);
  std::error_code ec;
  fs::remove_all(p.tmp_dir, ec);
}

// Holds an exclusive flock on a directory (where the filesystem has locks) until destroyed.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) : fd_(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
    DS_CHECK(fd_ >= 0, "cannot open " << dir << ": " << std::strerror(errno));
    while (::flock(fd_, LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      DS_CHECK(errno == ENOLCK || errno == EOPNOTSUPP || errno == ENOSYS,
               "cannot lock " << dir << ": " << std::strerror(errno));
      break;  // no locks on this filesystem: the comparison is then not serialised
    }
  }
  ~DirLock() { ::close(fd_); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_;
};

}  // namespace

void place_tag(const PendingSave& p) {
  const DirIdentity now = dir_identity(p.final_dir);
  if (now.exists && p.tag_seen.exists) {
    if (now != p.tag_seen) throw_tag_taken(p, "replaced");
    exchange_seen_copy(p);
    return;
  }
  // A new tag, or an overwrite whose old copy is gone: nothing may be replaced.
  if (rename_noreplace(p.tmp_dir, p.final_dir)) return;
  if (errno == EEXIST || errno == ENOTEMPTY) throw_tag_taken(p, "committed");
  DS_THROW("cannot rename " << p.tmp_dir << " to " << p.final_dir << ": " << std::strerror(errno));
}

void move_latest(const PendingSave& p, std::int64_t global_steps) {
  DirLock lock(p.save_dir);  // another dstrain job compares and moves `latest` in turn
  if (global_steps >= 0) {
    std::optional<std::string> current;
    try {
      current = read_latest(p.save_dir);
    } catch (const std::exception&) {
      // unreadable `latest` (damaged, not a tag): replaced below
    }
    const std::optional<Manifest> theirs =
        current && *current != p.tag ? manifest_of((fs::path(p.save_dir) / *current).string()) : std::nullopt;
    if (theirs && theirs->global_steps > global_steps) {
      DS_WARN("'latest' in " << p.save_dir << " stays at '" << *current << "' (global step " << theirs->global_steps
                             << "): this save, '" << p.tag << "', is at the earlier step " << global_steps
                             << " ('latest' only moves forward)");
      return;
    }
  }
  const std::string latest = (fs::path(p.save_dir) / kLatestFile).string();
  // Written inside the committed tag, then renamed over `latest`: a crash in between leaves a
  // stray file there, never a file in the save directory that a cleaner would have to
  // recognise.
  const std::string tmp = (fs::path(p.final_dir) / "latest.new").string();
  write_text_file_synced(tmp, p.tag);  // no newline, as DeepSpeed
  DS_CHECK(::rename(tmp.c_str(), latest.c_str()) == 0,
           "cannot rename " << tmp << " to " << latest << ": " << std::strerror(errno));
  fsync_path(p.save_dir);
}

}  // namespace detail

}  // namespace ds::io
