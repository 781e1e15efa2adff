// SwapDir (ds/io/swap_dir.h): the checks of nvme_path, the removal of directories that killed
// jobs left (and only those), removal at destruction, the free-space check, and ranks of one
// node creating their directories at once.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ds/io/aio.h"
#include "ds/io/swap_dir.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace ds::io;

namespace {

const std::string kKey = "zero_optimization.offload_optimizer.nvme_path";

std::string host() {
  char b[256] = {};
  ::gethostname(b, sizeof b - 1);
  return b;
}

// A sibling directory as another job would have left it; returns its path.
std::string make_sibling(const fs::path& base, const std::string& name, bool lock_file) {
  const fs::path p = base / name;
  fs::create_directories(p);
  std::ofstream(p / "optimizer.swap") << std::string(10000, 'x');
  if (lock_file) std::ofstream(p / "lock").put('\0');
  return p.string();
}

void age(const std::string& path, int seconds) {
  timeval tv[2];
  ::gettimeofday(&tv[0], nullptr);
  tv[0].tv_sec -= seconds;
  tv[1] = tv[0];
  ASSERT_EQ(::utimes(path.c_str(), tv), 0);
}

}  // namespace

TEST(SwapDir, MissingPath) {
  TempDir d("ds_swapdir");
  const std::string p = (d.path / "nope").string();
  EXPECT_HAS(error_of([&] { SwapDir s(p, kKey, 0, 0); }), kKey + " " + p + " does not exist");
}

TEST(SwapDir, FileInsteadOfDirectory) {
  TempDir d("ds_swapdir");
  const std::string p = (d.path / "file").string();
  std::ofstream(p) << "x";
  EXPECT_HAS(error_of([&] { SwapDir s(p, kKey, 0, 0); }), kKey + " " + p + " is not a directory");
}

TEST(SwapDir, ReadOnlyFileSystem) {
  TempDir d("ds_swapdir");
  if (::mount("tmpfs", d.path.c_str(), "tmpfs", MS_RDONLY, "size=64k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root)";
  const std::string e = error_of([&] { SwapDir s(d.path.string(), kKey, 0, 0); });
  ::umount(d.path.c_str());
  EXPECT_HAS(e, kKey + " " + d.path.string() + " is not writable (Read-only file system)");
}

TEST(SwapDir, FreeSpaceCheck) {
  TempDir d("ds_swapdir");
  const std::string e = error_of([&] { SwapDir s(d.path.string(), kKey, 0, std::size_t(1) << 60); });
  EXPECT_HAS(e, kKey + " " + d.path.string() + ": 1073741824.06 GiB needed for the swap files, ");
  EXPECT_HAS(e, " GiB free");
}

TEST(SwapDir, LayoutAndRemovalAtDestruction) {
  TempDir d("ds_swapdir");
  std::string dir;
  {
    SwapDir s(d.path.string() + "/", kKey, 3, 1 << 20);
    dir = s.path();
    EXPECT_EQ(dir, (d.path / "dstrain-swap" / (host() + "-" + std::to_string(::getpid()) + "-rank3")).string());
    EXPECT_TRUE(fs::is_directory(dir));
    EXPECT_TRUE(fs::exists(dir + "/lock"));
    EXPECT_EQ(s.file("fp32.swap"), dir + "/fp32.swap");
    SwapFile kept = SwapFile::create(s.file("fp32.swap"), 8192, /*remove_on_close=*/false);
    SwapDir moved = std::move(s);
    EXPECT_EQ(moved.path(), dir);
  }
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_TRUE(fs::is_directory(d.path / "dstrain-swap"));  // shared with other ranks: stays
  struct stat st {};
  ASSERT_EQ(::stat((d.path / "dstrain-swap").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 01777u);  // every user's jobs, none removing another's
}

// Siblings of this host: a dead job's (lock free) and an old one without a lock file are
// removed; a live one (lock held: here through a second open file description, as flock
// locks belong to those), a young one without a lock file (being created right now) and
// another host's are kept.
TEST(SwapDir, StaleDirectoriesRemovedLiveOnesKept) {
  TempDir d("ds_swapdir");
  const fs::path base = d.path / "dstrain-swap";
  const std::string h = host();
  const std::string dead = make_sibling(base, h + "-999999991-rank0", true);
  const std::string live = make_sibling(base, h + "-999999992-rank1", true);
  const std::string young = make_sibling(base, h + "-999999993-rank2", false);
  const std::string old = make_sibling(base, h + "-999999994-rank3", false);
  age(old, 2 * SwapDir::kNoLockGraceSeconds);
  const std::string other = make_sibling(base, "elsewhere-999999995-rank0", true);
  const std::string unrelated = make_sibling(base, h + "-notes", true);
  const int held = ::open((live + "/lock").c_str(), O_RDWR);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX | LOCK_NB), 0);
  {
    SwapDir s(d.path.string(), kKey, 0, 0);
    EXPECT_FALSE(fs::exists(dead));
    EXPECT_FALSE(fs::exists(old));
    EXPECT_TRUE(fs::exists(live + "/optimizer.swap"));
    EXPECT_TRUE(fs::exists(young + "/optimizer.swap"));
    EXPECT_TRUE(fs::exists(other + "/optimizer.swap"));
    EXPECT_TRUE(fs::exists(unrelated + "/optimizer.swap"));
    // A second live SwapDir (its own lock) survives the cleaning a third one does.
    SwapDir t(d.path.string(), kKey, 1, 0);
    SwapDir u(d.path.string(), kKey, 2, 0);
    EXPECT_TRUE(fs::exists(s.path() + "/lock"));
    EXPECT_TRUE(fs::exists(t.path() + "/lock"));
  }
  ::close(held);
  // The lock released: the next one removes it.
  SwapDir s(d.path.string(), kKey, 0, 0);
  EXPECT_FALSE(fs::exists(live));
}

// The real case: another process's live directory is kept; once that process is killed
// (SIGKILL: no destructor ran) the next SwapDir removes it.
TEST(SwapDir, KilledProcessDirectoryRemoved) {
  TempDir d("ds_swapdir");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    try {
      SwapDir s(d.path.string(), kKey, 7, 0);
      SwapFile f = SwapFile::create(s.file("optimizer.swap"), 1 << 20);
      const char c = 'r';
      if (::write(ready[1], &c, 1) != 1) ::_exit(2);
      for (;;) ::pause();
    } catch (...) {
      ::_exit(1);
    }
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1) << "the child could not make its swap directory";
  ::close(ready[0]);
  const std::string theirs = (d.path / "dstrain-swap" / (host() + "-" + std::to_string(child) + "-rank7")).string();
  {
    SwapDir s(d.path.string(), kKey, 0, 0);
    EXPECT_TRUE(fs::exists(theirs + "/optimizer.swap"));
  }
  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(fs::exists(theirs + "/optimizer.swap"));  // a killed job leaves its files
  SwapDir s(d.path.string(), kKey, 0, 0);
  EXPECT_FALSE(fs::exists(theirs));
}

// A dead process's directory under our own name (containers reuse pids) is taken over; a
// live one (a second SwapDir for the same rank) is an error.
TEST(SwapDir, SameNameDeadTakenOverLiveRefused) {
  TempDir d("ds_swapdir");
  const std::string name = host() + "-" + std::to_string(::getpid()) + "-rank4";
  const std::string mine = make_sibling(d.path / "dstrain-swap", name, true);
  SwapDir s(d.path.string(), kKey, 4, 0);
  EXPECT_EQ(s.path(), mine);
  EXPECT_FALSE(fs::exists(mine + "/optimizer.swap"));
  EXPECT_HAS(error_of([&] { SwapDir t(d.path.string(), kKey, 4, 0); }), "is in use");
  EXPECT_TRUE(fs::exists(mine + "/lock"));
}

// The ranks of a node at once, each cleaning the others' siblings while they are created:
// every one ends up with its own live directory.
TEST(SwapDir, ConcurrentCreation) {
  TempDir d("ds_swapdir");
  for (int round = 0; round < 5; ++round) {
    constexpr int kRanks = 8;
    std::vector<std::unique_ptr<SwapDir>> dirs(kRanks);
    std::vector<std::string> errors(kRanks);
    std::atomic<int> ready{0};
    std::vector<std::thread> th;
    for (int r = 0; r < kRanks; ++r)
      th.emplace_back([&, r] {
        ++ready;
        while (ready.load() < kRanks) std::this_thread::yield();
        errors[std::size_t(r)] = error_of([&] { dirs[std::size_t(r)] = std::make_unique<SwapDir>(d.path.string(), kKey, r, 0); });
      });
    for (auto& t : th) t.join();
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(errors[std::size_t(r)], "(no error)") << "rank " << r;
      ASSERT_TRUE(dirs[std::size_t(r)]);
      EXPECT_TRUE(fs::exists(dirs[std::size_t(r)]->path() + "/lock")) << "rank " << r << " round " << round;
    }
  }
}
