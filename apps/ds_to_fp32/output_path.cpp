#include "output_path.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_NOREPLACE (glibc >= 2.28)
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "ds/core/error.h"
#include "ds/core/file_read.h"

namespace fs = std::filesystem;

namespace ds::tools {

namespace {

// True when `inner` equals `outer` or lies below it (both already canonical).
bool is_within(const fs::path& inner, const fs::path& outer) {
  auto i = inner.begin();
  for (auto o = outer.begin(); o != outer.end(); ++o, ++i) {
    if (o->empty()) continue;  // a trailing separator
    if (i == inner.end() || *i != *o) return false;
  }
  return true;
}

// What sits at `output` now (the link itself for a symlink), or false when nothing does.
bool exists_at(const std::string& output, struct stat& st) {
  if (::lstat(output.c_str(), &st) == 0) return true;
  const int err = errno;
  DS_CHECK(err == ENOENT, "cannot stat OUTPUT " << output << ": " << std::strerror(err));
  return false;
}

// Refuses an existing OUTPUT that is (or, for a symlink, points at) anything but a regular file.
void check_kind(const std::string& output, const struct stat& lst) {
  struct stat st = lst;
  if (S_ISLNK(lst.st_mode) && ::stat(output.c_str(), &st) != 0) return;  // a dangling link: nothing behind it
  DS_CHECK(S_ISREG(st.st_mode), "OUTPUT " << output << " is a " << file_type_name(st.st_mode)
                                          << ", not a regular file; ds_to_fp32 writes only regular files");
}

}  // namespace

void check_output_path(const std::string& output, const std::string& checkpoint_dir, bool force) {
  std::error_code ec;
  const fs::path out = fs::weakly_canonical(fs::absolute(output), ec);
  DS_CHECK(!ec, "cannot resolve OUTPUT " << output << ": " << ec.message());
  const fs::path ckpt = fs::weakly_canonical(fs::absolute(checkpoint_dir), ec);
  DS_CHECK(!ec, "cannot resolve CHECKPOINT_DIR " << checkpoint_dir << ": " << ec.message());
  DS_CHECK(!is_within(out, ckpt), "OUTPUT " << output << " lies inside the checkpoint directory " << checkpoint_dir
                                            << " (resolved: " << out.string() << "); write it elsewhere");
  struct stat st {};
  if (!exists_at(output, st)) return;
  check_kind(output, st);
  DS_CHECK(force, "OUTPUT " << output << " already exists; pass --force to replace it");
}

void commit_output(const std::string& tmp, const std::string& output, bool force) {
  struct stat st {};
  if (exists_at(output, st)) {  // checked again: something may have appeared while converting
    check_kind(output, st);
    DS_CHECK(force, "OUTPUT " << output << " already exists; pass --force to replace it");
  }
  if (!force) {
    if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, output.c_str(), RENAME_NOREPLACE) == 0) return;
    const int err = errno;
    DS_CHECK(err != EEXIST, "OUTPUT " << output << " already exists; pass --force to replace it");
    DS_CHECK(err == EINVAL || err == ENOSYS, "cannot rename " << tmp << " to " << output << ": " << std::strerror(err));
    // The file system has no RENAME_NOREPLACE: the check above is the best there is.
  }
  DS_CHECK(::rename(tmp.c_str(), output.c_str()) == 0,
           "cannot rename " << tmp << " to " << output << ": " << std::strerror(errno));
}

}  // namespace ds::tools
