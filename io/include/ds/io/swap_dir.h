// The directory of one rank's swap files (docs/dev/offload.md):
//   <nvme_path>/dstrain-swap/<hostname>-<pid>-rank<R>/
// Several ranks of a node (and several jobs) share nvme_path, and a killed job leaves its
// files behind; each live directory therefore holds a file "lock", flock()ed LOCK_EX for the
// directory's lifetime, so a later job can tell a dead directory (its lock can be taken) from
// a live one and remove only the former.
#pragma once

#include <cstddef>
#include <string>

namespace ds::io {

// Creating it:
// (1) checks nvme_path; `key` names the config key in every message (e.g.
//     "zero_optimization.offload_optimizer.nvme_path"): "<key> <path> does not exist",
//     "<key> <path> is not a directory", "<key> <path> is not writable (<strerror>)";
// (2) removes stale sibling directories left by killed jobs (a sibling whose lock can be
//     taken, or one without a lock file older than a minute), one log line per directory;
// (3) checks free space with statvfs: need_bytes (what the caller will create) plus a margin
//     must be available, else "<key> <path>: N GiB needed for the swap files, M GiB free".
// The destructor removes its files and the directory. Move-only.
class SwapDir {
 public:
  SwapDir(const std::string& nvme_path, const std::string& key, int rank, std::size_t need_bytes);
  ~SwapDir();
  SwapDir(SwapDir&& o) noexcept;
  SwapDir& operator=(SwapDir&& o) noexcept;
  SwapDir(const SwapDir&) = delete;
  SwapDir& operator=(const SwapDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const;  // path()/name

  // The margin over need_bytes that the free-space check asks for (file-system metadata, and
  // the logs and checkpoints that may share the disk).
  static constexpr std::size_t kFreeMargin = std::size_t(64) << 20;
  // A sibling without a lock file younger than this is being created right now: left alone.
  static constexpr int kNoLockGraceSeconds = 60;

 private:
  void remove_now() noexcept;
  std::string path_;
  int lock_fd_ = -1;
};

}  // namespace ds::io
