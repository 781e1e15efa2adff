// Where dstok encode's shards go, without ever changing a file a reader may hold: each shard
// is written to a hidden temporary file in the output directory (O_EXCL: never through a
// symlink) and all are renamed into place only once every one is complete. A job that has
// the old shards mapped keeps reading the old files (rename replaces the name, not the
// file), a failure or a full disk leaves no partial shard, and a symlink at a shard name is
// replaced, never written through.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ds::tools {

// PREFIX_000000.bin for index 0 (six digits or more).
std::string shard_path(const std::string& prefix, std::size_t index);

class ShardOutput {
 public:
  // Checks --output PREFIX: its directory exists and files can be created in it, and no
  // shard of the prefix exists (PREFIX_<digits>.bin, symlinks included) unless `force`.
  // Throws ds::Error naming the path.
  ShardOutput(const std::string& prefix, bool force);
  ~ShardOutput();  // removes the temporary files not committed
  ShardOutput(const ShardOutput&) = delete;
  ShardOutput& operator=(const ShardOutput&) = delete;

  // Throws unless the directory's file system has `bytes` free for this user (statvfs);
  // `what` says how the size was reckoned.
  void check_space(std::uint64_t bytes, const std::string& what) const;

  // Writes shard `index` (the next one) to a temporary file; returns its final path.
  std::string write(std::span<const std::int32_t> tokens, int version);

  // Renames the written shards into place, in order; with `force`, then removes the prefix's
  // older shards numbered from the count written on, so a glob of the prefix matches only
  // this run's shards.
  void commit();

 private:
  std::string prefix_;
  std::string dir_;
  bool force_;
  std::vector<std::pair<std::string, std::string>> pending_;  // (temporary, final) paths
};

}  // namespace ds::tools
