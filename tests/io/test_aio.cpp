// Swap files and the asynchronous I/O queue (ds/io/aio.h): round trips at awkward sizes and
// offsets (multi-block requests, several in flight, the unaligned bounce path, read back with
// other queue settings), and the errors a user sees (each names the file).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "ds/io/aio.h"
#include "../common/temp_dir.h"

namespace fs = std::filesystem;
using namespace ds::io;

namespace {

// Bytes that differ by position and by `seed`, so a piece in the wrong place shows.
void fill(void* p, std::size_t n, std::uint32_t seed) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>((i * 2654435761u + seed * 40503u) >> 13);
}

// A small tmpfs mounted for the test (root with CAP_SYS_ADMIN only; tests skip otherwise).
struct SmallTmpfs {
  TempDir dir{"ds_aio_tmpfs"};
  bool mounted = false;
  SmallTmpfs(const char* size, unsigned long flags = 0) {
    mounted = ::mount("tmpfs", dir.path.c_str(), "tmpfs", flags, (std::string("size=") + size).c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (mounted) ::umount(dir.path.c_str());
  }
};

}  // namespace

TEST(Aio, AlignedBufferRoundsUpAndZeroFills) {
  AlignedBuffer b(5000);
  EXPECT_EQ(b.bytes(), 2 * kDirectAlign);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(b.data()) % kDirectAlign, 0u);
  for (std::size_t i = 0; i < b.bytes(); ++i) ASSERT_EQ(b.as<unsigned char>()[i], 0) << i;
  AlignedBuffer m = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(m.bytes(), 2 * kDirectAlign);
  EXPECT_EQ(AlignedBuffer().bytes(), 0u);
}

TEST(Aio, SwapFileReservesAndRemovesOnClose) {
  TempDir d("ds_aio");
  const std::string p = (d.path / "a.swap").string(), q = (d.path / "b.swap").string();
  {
    SwapFile f = SwapFile::create(p, 10000);
    EXPECT_EQ(f.bytes(), 3 * kDirectAlign);
    EXPECT_EQ(fs::file_size(p), 3 * kDirectAlign);
    EXPECT_EQ(f.path(), p);
    SwapFile g = SwapFile::create(q, 1, /*remove_on_close=*/false);
    SwapFile moved = std::move(f);
    EXPECT_EQ(f.fd(), -1);
    EXPECT_TRUE(fs::exists(p));
  }
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::exists(q));
}

// Several multi-block requests in flight at awkward sizes, waited for out of order, then read
// back with different queue settings.
static void several_in_flight(bool direct) {
  SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
  TempDir d("ds_aio");
  const std::size_t sizes[] = {3 * 65536 + 100, 1, kDirectAlign, 5 * 65536, 12345};
  std::size_t total = 0;
  for (auto s : sizes) total += align_up(s);
  SwapFile f = SwapFile::create((d.path / "rt.swap").string(), total, true, direct);
  if (!direct) {
    EXPECT_FALSE(f.direct());
  }
  std::vector<AlignedBuffer> src, dst;
  std::vector<std::size_t> offs;
  {
    AioQueue q({.block_size = 65536, .queue_depth = 4, .thread_count = 2});
    EXPECT_EQ(q.threads(), 8);
    std::vector<Ticket> t;
    std::size_t off = 0;
    for (std::size_t i = 0; i < std::size(sizes); ++i) {
      src.emplace_back(sizes[i]);
      fill(src.back().data(), sizes[i], std::uint32_t(i + 1));
      offs.push_back(off);
      t.push_back(q.write(f, off, sizes[i], src.back().data()));
      off += align_up(sizes[i]);
    }
    for (std::size_t i = t.size(); i-- > 0;) q.wait(t[i]);
    q.wait(t[0]);  // a ticket already waited for returns at once
    std::size_t asked = 0;
    for (auto sz : sizes) asked += sz;
    EXPECT_EQ(q.bytes_written(), f.direct() ? total : asked);  // direct: lengths rounded up
  }
  AioQueue r({.block_size = 1 << 20, .queue_depth = 1, .thread_count = 1});
  std::vector<Ticket> t;
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    dst.emplace_back(sizes[i]);
    t.push_back(r.read(f, offs[i], sizes[i], dst.back().data()));
  }
  r.wait_all();
  for (std::size_t i = 0; i < std::size(sizes); ++i)
    EXPECT_EQ(std::memcmp(src[i].data(), dst[i].data(), sizes[i]), 0) << "request " << i << " of " << sizes[i] << " bytes";
  // One request over the whole file with yet another block size.
  AioQueue w({.block_size = 12288, .queue_depth = 3, .thread_count = 1});
  AlignedBuffer all(total);
  w.wait(w.read(f, 0, total, all.data()));
  for (std::size_t i = 0; i < std::size(sizes); ++i)
    EXPECT_EQ(std::memcmp(src[i].data(), all.as<char>() + offs[i], sizes[i]), 0) << "request " << i;
}
TEST(Aio, RoundTripSeveralInFlight) {
  several_in_flight(true);
  several_in_flight(false);  // the fallback where the file system refuses O_DIRECT
}

// The destructor finishes what was queued before it joins.
TEST(Aio, DestructorFinishesQueuedWrites) {
  TempDir d("ds_aio");
  const std::size_t n = std::size_t(1) << 20;
  SwapFile f = SwapFile::create((d.path / "q.swap").string(), 4 * n);
  std::vector<AlignedBuffer> bufs;
  {
    AioQueue q({.block_size = 65536, .queue_depth = 2, .thread_count = 1});
    for (int i = 0; i < 4; ++i) {
      bufs.emplace_back(n);
      fill(bufs.back().data(), n, std::uint32_t(100 + i));
      q.write(f, std::size_t(i) * n, n, bufs.back().data());
    }
  }
  AioQueue q({});
  AlignedBuffer back(4 * n);
  q.wait(q.read(f, 0, 4 * n, back.data()));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(std::memcmp(back.as<char>() + std::size_t(i) * n, bufs[std::size_t(i)].data(), n), 0) << i;
}

// Any offset and length through the bounce buffer, against a model of the file: partial first
// and last blocks keep their neighbours (read-modify-write), windows larger than the bounce
// buffer, writes past the reserved size.
static void unaligned_round_trip(bool direct) {
  SCOPED_TRACE(direct ? "O_DIRECT" : "buffered");
  TempDir d("ds_aio");
  const std::size_t size = 200000;
  SwapFile f = SwapFile::create((d.path / "u.swap").string(), size, true, direct);
  std::vector<unsigned char> model(f.bytes(), 0);
  AioQueue q({.block_size = 16384, .queue_depth = 2, .thread_count = 1});
  struct Op { std::size_t off, len; };
  const Op ops[] = {{1, 3}, {4095, 2}, {4096, 4096}, {12345, 70000}, {0, 1}, {8191, 1}, {100000, 16384}, {150001, 49000}};
  std::uint32_t seed = 7;
  for (const auto& op : ops) {
    std::vector<unsigned char> v(op.len);
    fill(v.data(), op.len, ++seed);
    q.write_unaligned(f, op.off, op.len, v.data());
    std::memcpy(model.data() + op.off, v.data(), op.len);
  }
  AlignedBuffer all(model.size());
  q.wait(q.read(f, 0, model.size(), all.data()));
  ASSERT_EQ(std::memcmp(all.data(), model.data(), model.size()), 0);
  for (const auto& op : ops) {
    for (const Op r : {op, Op{op.off > 7 ? op.off - 7 : 0, op.len + 14}}) {
      std::vector<unsigned char> v(r.len);
      q.read_unaligned(f, r.off, r.len, v.data());
      EXPECT_EQ(std::memcmp(v.data(), model.data() + r.off, r.len), 0) << "read of " << r.len << " at " << r.off;
    }
  }
}
TEST(Aio, UnalignedRoundTrip) {
  unaligned_round_trip(true);
  unaligned_round_trip(false);
}

TEST(Aio, MisalignedDirectRequestNamesFileAndOffset) {
  TempDir d("ds_aio");
  const std::string p = (d.path / "m.swap").string();
  SwapFile f = SwapFile::create(p, 65536);
  if (!f.direct()) GTEST_SKIP() << "the temp file system refuses O_DIRECT";
  AioQueue q({});
  AlignedBuffer b(8192);
  const std::string e = error_of([&] { q.write(f, 100, 4096, b.data()); });
  EXPECT_HAS(e, p + ": direct write at offset 100 needs the offset and the buffer address aligned to 4096 bytes");
  EXPECT_HAS(error_of([&] { q.read(f, 4096, 4096, b.as<char>() + 1); }), p + ": direct read at offset 4096");
}

TEST(Aio, ReadPastEndNamesFile) {
  TempDir d("ds_aio");
  const std::string p = (d.path / "e.swap").string();
  SwapFile f = SwapFile::create(p, 8192);
  AioQueue q({.block_size = 4096, .queue_depth = 2, .thread_count = 1});
  AlignedBuffer b(16384);
  const Ticket t = q.read(f, 0, 16384, b.data());
  EXPECT_HAS(error_of([&] { q.wait(t); }), p + ": read of 16384 bytes at offset 0 failed at offset 8192: the file ends before it");
  // Up to the file's end is fine.
  std::vector<char> tail(100);
  q.read_unaligned(f, 8100, 92, tail.data());
}

TEST(Aio, WriteErrorNamesFile) {
  TempDir d("ds_aio");
  const std::string p = (d.path / "w.swap").string();
  SwapFile f = SwapFile::create(p, 65536);
  // The swap file's descriptor replaced by a read-only one: every pwrite fails with EBADF.
  const int ro = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  ASSERT_EQ(::dup2(ro, f.fd()), f.fd());
  ::close(ro);
  AioQueue q({.block_size = 16384, .queue_depth = 2, .thread_count = 1});
  AlignedBuffer b(65536);
  const Ticket t = q.write(f, 8192, 40000, b.data());
  EXPECT_HAS(error_of([&] { q.wait(t); }), p + ": write of 40000 bytes at offset 8192 failed at offset ");
  q.write(f, 0, 4096, b.data());
  EXPECT_HAS(error_of([&] { q.wait_all(); }), "Bad file descriptor");
  EXPECT_HAS(error_of([&] { q.write_unaligned(f, 3, 5, b.data()); }), p + ": write of 5 bytes at offset 3 failed");
  SwapFile closed = std::move(f);
  EXPECT_HAS(error_of([&] { q.write(f, 0, 4096, b.data()); }), "the file is not open");
}

TEST(Aio, CreateInMissingDirectoryNamesPath) {
  TempDir d("ds_aio");
  const std::string p = (d.path / "no" / "x.swap").string();
  EXPECT_HAS(error_of([&] { SwapFile::create(p, 4096); }), p + ": cannot create swap file: No such file or directory");
}

// A full disk: at create() (posix_fallocate) and, for an unreserved file, at the write.
TEST(Aio, FullDiskNamesFileAndSaysFull) {
  SmallTmpfs t("256k");
  if (!t.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  const std::string p = (t.dir.path / "big.swap").string();
  EXPECT_HAS(error_of([&] { SwapFile::create(p, std::size_t(1) << 20); }),
             p + ": cannot reserve 1048576 bytes (No space left on device); free space on " + t.dir.path.string() +
                 " or point nvme_path elsewhere");
  EXPECT_FALSE(fs::exists(p));
  SwapFile f = SwapFile::create((t.dir.path / "grow.swap").string(), 0);
  AioQueue q({.block_size = 65536, .queue_depth = 2, .thread_count = 1});
  AlignedBuffer b(std::size_t(1) << 20);
  const Ticket w = q.write(f, 0, b.bytes(), b.data());
  const std::string e = error_of([&] { q.wait(w); });
  EXPECT_HAS(e, f.path() + ": write of 1048576 bytes at offset 0 failed at offset ");
  EXPECT_HAS(e, "No space left on device; the disk is full");
}
