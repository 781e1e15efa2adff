// Where ds_to_fp32 may put its output. The tool writes OUTPUT.tmp-<pid> and renames it over
// OUTPUT, and a rename replaces whatever the name points at: a device node (/dev/null as
// root), a file of the checkpoint being read, or a user's file. These checks refuse that.
#pragma once

#include <string>

namespace ds::tools {

// Throws ds::Error when `output`
//  - lies inside `checkpoint_dir` (both resolved, symlinks followed; converting into the
//    checkpoint would replace or add files in it),
//  - exists and is not a regular file (a directory, FIFO, device, socket ...), or
//  - exists and `force` is false.
void check_output_path(const std::string& output, const std::string& checkpoint_dir, bool force);

// Renames the finished `tmp` to `output`. Without `force` the rename never replaces a file
// that appeared since check_output_path (RENAME_NOREPLACE where the file system has it).
void commit_output(const std::string& tmp, const std::string& output, bool force);

}  // namespace ds::tools
