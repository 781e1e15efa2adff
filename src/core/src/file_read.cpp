#include "ds/core/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "ds/core/error.h"

namespace ds {

namespace {

std::string describe_size(std::uint64_t bytes) {
  std::string s = std::to_string(bytes) + " bytes";
  if (bytes >= (std::uint64_t(1) << 20) && bytes % (std::uint64_t(1) << 20) == 0)
    s += " (" + std::to_string(bytes >> 20) + " MiB)";
  return s;
}

void require_regular(const struct stat& st, const std::string& path, std::string_view what) {
  DS_CHECK(S_ISREG(st.st_mode), what << " " << path << " is a " << file_type_name(st.st_mode) << ", not a regular file");
}

}  // namespace

const char* file_type_name(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG: return "regular file";
    case S_IFDIR: return "directory";
    case S_IFIFO: return "FIFO";
    case S_IFCHR: return "character device";
    case S_IFBLK: return "block device";
    case S_IFSOCK: return "socket";
    case S_IFLNK: return "symbolic link";
    default: return "special file";
  }
}

bool check_regular_file(const std::string& path, std::string_view what, bool missing_ok) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
      DS_CHECK(missing_ok, what << " " << path << " does not exist");
      return false;
    }
    DS_THROW("cannot stat " << what << " " << path << ": " << std::strerror(err));
  }
  require_regular(st, path, what);
  return true;
}

int open_regular_file(const std::string& path, std::string_view what) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  DS_CHECK(fd >= 0, "cannot open " << what << " " << path << ": " << std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    DS_THROW("cannot stat " << what << " " << path << ": " << std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    require_regular(st, path, what);
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

std::string read_regular_file(const std::string& path, std::string_view what, std::uint64_t max_bytes) {
  const int fd = open_regular_file(path, what);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    DS_THROW("cannot stat " << what << " " << path << ": " << std::strerror(err));
  }
  if (std::uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    DS_THROW(what << " " << path << " is " << describe_size(std::uint64_t(st.st_size)) << "; the limit is "
                  << describe_size(max_bytes));
  }
  // Read until end of file; a file that grows while read is still held to the cap (reading
  // one byte past it is how that shows). The end is found with a small read past the size
  // stat gave, so the usual file is held once, not in a string grown to twice its size.
  const std::uint64_t limit = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;
  std::string out(std::size_t(st.st_size), '\0');
  std::size_t got = 0;
  char more[65536];
  for (;;) {
    const bool past_size = got == out.size();
    if (past_size && out.size() >= limit) break;
    char* const into = past_size ? more : out.data() + got;
    const std::size_t room = past_size ? sizeof more : out.size() - got;
    const ssize_t n = ::read(fd, into, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      DS_THROW("cannot read " << what << " " << path << ": " << std::strerror(err));
    }
    if (n == 0) break;
    if (past_size) out.append(more, std::size_t(n));
    got += std::size_t(n);
  }
  ::close(fd);
  DS_CHECK(got <= max_bytes, what << " " << path << " is larger than the limit of " << describe_size(max_bytes));
  out.resize(got);
  return out;
}

std::string printable_excerpt(std::string_view bytes, std::size_t max_bytes) {
  std::string out;
  const std::string_view shown = bytes.substr(0, max_bytes);
  for (unsigned char c : shown) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out.push_back(char(c));
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  if (shown.size() < bytes.size()) out += "... (" + std::to_string(bytes.size()) + " bytes)";
  return out;
}

}  // namespace ds
