// Private to ds_io: what the checkpoint sources share. The store is split by job:
//   checkpoint.cpp              names, tag rules, layout signature, the test kill points
//   checkpoint_save.cpp         begin_save / write_local / commit_save (the protocol)
//   checkpoint_commit.cpp       rank 0's commit: the tag put in place, `latest` moved forward
//   checkpoint_collectives.cpp  the save's collectives (int64 and byte messages)
//   checkpoint_manifest.cpp     manifest.json: written by rank 0, parsed by the reader
//   checkpoint_reader.cpp       read_latest, CheckpointReader (verified, elastic reads)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ds/io/checkpoint.h"

namespace ds::io::detail {

std::string hex32(std::uint32_t v);  // 8 lower-case hex digits

// A tag names a directory: at most NAME_MAX bytes.
inline constexpr std::size_t kMaxTagBytes = 255;

// A name read from a checkpoint (or given for one) must name an entry directly inside the
// checkpoint directory: `latest` holding "../x" or "/abs", or a manifest naming "../../f",
// would otherwise make the reader open files anywhere.
bool is_plain_name(std::string_view s);

// Test hook (docs/dev/checkpoints.md): the debug variable DS_CKPT_TEST_KILL_AT=<phase>[@rank]
// makes the process raise SIGKILL when it reaches <phase>. Phases: begin, shard_write,
// before_manifest, before_rename, before_latest, after_latest.
void test_kill_point(std::string_view phase, int rank);

// ---- the save's collectives (checkpoint_collectives.cpp) ----

// What the first collective of a save settles, under a deadline of `timeout_s` seconds (0:
// none): whether every rank has the same tag and layout hash, and rank 0's save id. A rank
// that is alone in save_checkpoint gets ds::Error naming save_dir and tag when it passes.
struct SaveAgreement {
  bool same_tag = true;
  bool same_layout = true;
  std::uint64_t id = 0;  // rank 0's (48 bits: the tmp dir's 12 hex digits)
};
SaveAgreement agree_on_save(Communicator& comm, std::uint64_t tag_hash, std::uint64_t layout_hash, std::uint64_t id,
                            double timeout_s, const std::string& save_dir, const std::string& tag);
// Rank 0's tag on every rank (ds::Error on rank 0 when it is longer than 255 bytes).
std::string broadcast_tag(Communicator& comm, const std::string& tag);
// The largest of every rank's status code (0: fine).
std::int64_t max_status(Communicator& comm, std::int64_t status);

// What each rank reports after writing its files (commit_save gathers it).
struct ShardReport {
  bool ok = false;          // its files are written and fsynced, with every shard dataset
  bool has_shard = false;
  std::uint64_t offset = 0, count = 0;
  std::vector<ShardRange> ranges;   // multi-range shard (empty: the slice offset/count)
  std::vector<std::uint32_t> crcs;  // per shard dataset, in PendingSave's order
};
// Every rank's report, by rank; `k` shard datasets each (one more collective finds the
// longest range list, so a report's length is the same on every rank).
std::vector<ShardReport> gather_reports(Communicator& comm, const ShardReport& mine, std::size_t k);

// ---- shard ranges (checkpoint.cpp) ----

// One rank's range of the flat space, for the tiling check.
struct RankRange {
  int rank = 0;
  std::size_t offset = 0, count = 0;
};
// Empty when the ranges (zero-length ones ignored) tile [0, flat_numel) exactly; otherwise
// one phrase naming the first overlap, gap or range past the end ("rank 1's range [10, 20)
// overlaps rank 0's range [0, 12)").
std::string tiling_problem(std::vector<RankRange> ranges, std::size_t flat_numel);
// Empty when one rank's ranges are valid (increasing, non-overlapping, inside
// [0, flat_numel), counts summing to shard_count); otherwise what is wrong.
std::string local_ranges_problem(const std::vector<ShardRange>& ranges, std::size_t shard_count, std::size_t flat_numel);

// ---- rank 0's commit (checkpoint_commit.cpp) ----

// Puts the complete tmp dir in place as <tag>, never over a tag this save did not see: a tag
// absent at begin_save by a no-replace rename, an overwrite by an exchange with the very copy
// begin_save saw (checked again after the exchange, swapped back otherwise). ds::Error naming
// the other writer (from its manifest) when another save took the tag in between; nothing of
// that writer's is changed then.
void place_tag(const PendingSave& pending);
// Points <save_dir>/latest at pending.tag, unless it names a checkpoint of a later global step
// (then it stays, with a warning). Serialised with other writers by a lock on save_dir.
void move_latest(const PendingSave& pending, std::int64_t global_steps);
// Creates (or truncates) `path` with `text`, fsynced.
void write_text_file_synced(const std::string& path, const std::string& text);

// ---- manifest.json (checkpoint_manifest.cpp) ----

// The manifest rank 0 writes for a committed save: its own metadata from `local`, every
// rank's partition and checksums from `reports`.
std::string manifest_text(const PendingSave& pending, int world_size, const LocalWriteResult& local,
                          const std::vector<ShardReport>& reports);
// Parses and checks <dir>/manifest.json (errors name the path and field).
Manifest parse_manifest(const std::string& path);

}  // namespace ds::io::detail
