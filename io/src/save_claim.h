// Temporary save directories and who owns them (private to ds_io).
//
// A save writes into "<tag>.tmp-<12 hex digits>" and renames it to <tag> at commit. The
// first thing put into that directory is a marker file, .dstrain-save, which the saving
// process keeps open with an exclusive flock for the whole save and which records the
// writer: pid, host, boot id and process start time. A later save removes a leftover tmp
// directory only when all of this says its writer is gone: the exact name pattern, a real
// directory (not a symlink) holding a well-formed marker, the lock free, and the recorded
// process dead on this host (a writer on another host cannot be checked, so its directory
// is left alone). Everything else in the save directory -- users' files and folders, another
// job's save in progress -- is never touched.
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace ds::io::detail {

inline constexpr const char* kSaveMarker = ".dstrain-save";

// "<name>.tmp-" followed by exactly 12 lowercase hex digits, <name> non-empty.
bool is_tmp_dir_name(std::string_view name);

// An exclusive lock on a directory's marker, held until the last copy is destroyed.
using SaveClaim = std::shared_ptr<void>;

// Creates directory `dir` (which must not exist) and, before anything else goes into it, its
// marker: locked, the writer's record written and fsynced. ds::Error naming the path.
SaveClaim create_claimed_dir(const std::string& dir);
// Writes (or rewrites) the marker into the existing directory `dir` and locks it: used on the
// old copy of a tag replaced by an overwrite, which sits under the tmp name until removed.
SaveClaim claim_existing_dir(const std::string& dir);

// This process as a save's writer, for messages: "pid 12 on host h" (", Slurm job 7" when
// Slurm started it).
std::string writer_description();

// Removes leftover tmp directories of saves whose writer is gone (see above); returns how many.
int remove_abandoned_tmp_dirs(const std::string& save_dir);

}  // namespace ds::io::detail
