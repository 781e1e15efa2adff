// Reading files a user names (configs, `latest`, manifests, env files, checkpoint shards)
// without trusting what the path is: a FIFO would block the reader forever and /dev/zero
// would grow memory without bound, so readers open only regular files, and small control
// files are read only up to a size cap.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ds {

// The cap for small control files: a DeepSpeed config, a checkpoint's `latest`, an
// environment file. Real ones are a few KiB; this leaves ample room.
inline constexpr std::uint64_t kMaxControlFileBytes = std::uint64_t(4) << 20;  // 4 MiB

// What a stat() mode says a path is: "regular file", "directory", "FIFO", "character
// device", "block device", "socket", "symbolic link" or "special file".
const char* file_type_name(unsigned mode);

// Throws ds::Error "<what> <path> is a <kind>, not a regular file" unless `path` (symlinks
// followed) is a regular file. When it does not exist: returns false if `missing_ok`,
// otherwise throws "<what> <path> does not exist".
bool check_regular_file(const std::string& path, std::string_view what, bool missing_ok = false);

// Opens `path` read-only (O_CLOEXEC) as a regular file: opened non-blocking so a FIFO cannot
// block, then fstat-checked (the same errors as check_regular_file). Returns the descriptor,
// in blocking mode; the caller closes it.
int open_regular_file(const std::string& path, std::string_view what);

// The whole content of the regular file `path`, refused (ds::Error with the size and the cap)
// when it holds more than `max_bytes` (UINT64_MAX: no cap, for data files).
std::string read_regular_file(const std::string& path, std::string_view what,
                              std::uint64_t max_bytes = kMaxControlFileBytes);

// Bytes read from such a file, made safe to echo in a message: printable ASCII as is, a
// backslash as "\\", any other byte as "\xNN", and at most `max_bytes` of the input shown
// ("... (N bytes)" after a cut), so a file of random bytes cannot put control sequences or
// megabytes into an error line.
std::string printable_excerpt(std::string_view bytes, std::size_t max_bytes = 64);

}  // namespace ds
