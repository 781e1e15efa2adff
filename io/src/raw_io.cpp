#include "raw_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/io/checksum.h"

namespace ds::io::detail {

namespace {
constexpr std::size_t kParallelMin = std::size_t(8) << 20;  // below this, one thread
constexpr std::size_t kWriteChunk = std::size_t(8) << 20;   // pwrite + sync_file_range unit
}  // namespace

int io_threads(int requested) {
  if (requested > 0) return requested;
  static const int hw = int(std::clamp(std::thread::hardware_concurrency(), 1u, 4u));
  return hw;
}

void parallel_ranges(std::size_t bytes, const std::function<void(std::size_t, std::size_t)>& fn,
                     int requested_threads) {
  const int t = bytes < kParallelMin ? 1 : io_threads(requested_threads);
  if (t == 1) {
    fn(0, bytes);
    return;
  }
  const std::size_t per = (bytes / std::size_t(t)) & ~std::size_t(63);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(t));
  std::vector<std::thread> threads;
  for (int i = 1; i < t; ++i) {
    std::size_t lo = per * std::size_t(i), hi = i + 1 == t ? bytes : lo + per;
    threads.emplace_back([&, i, lo, hi] {
      try {
        fn(lo, hi);
      } catch (...) {
        errors[std::size_t(i)] = std::current_exception();
      }
    });
  }
  try {
    fn(0, per);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& th : threads) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

std::uint32_t crc32c_parallel(const void* data, std::size_t bytes, int threads) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::mutex mu;
  std::vector<std::pair<std::size_t, std::pair<std::uint32_t, std::size_t>>> parts;  // begin -> (crc, length)
  parallel_ranges(bytes, [&](std::size_t lo, std::size_t hi) {
    std::uint32_t c = crc32c(p + lo, hi - lo);
    std::lock_guard<std::mutex> lock(mu);
    parts.push_back({lo, {c, hi - lo}});
  }, threads);
  std::sort(parts.begin(), parts.end());
  std::uint32_t crc = 0;
  for (const auto& [lo, part] : parts) crc = crc32c_combine(crc, part.first, part.second);
  return crc;
}

void copy_parallel(void* dst, const void* src, std::size_t bytes, int threads) {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  parallel_ranges(bytes, [&](std::size_t lo, std::size_t hi) { std::memcpy(d + lo, s + lo, hi - lo); }, threads);
}

std::vector<std::uint32_t> write_raw(const std::vector<RawWrite>& jobs, const std::function<void(std::size_t)>& after_chunk,
                                     int requested_threads) {
  struct Chunk {
    std::size_t job;
    std::size_t begin, bytes;  // within the job
    std::uint32_t crc = 0;
  };
  std::vector<Chunk> chunks;
  for (std::size_t j = 0; j < jobs.size(); ++j)
    for (std::size_t o = 0; o < jobs[j].bytes; o += kWriteChunk) chunks.push_back({j, o, std::min(kWriteChunk, jobs[j].bytes - o)});

  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex mu;
  std::string error;
  auto worker = [&] {
    for (;;) {
      if (failed.load()) return;
      std::size_t i = next.fetch_add(1);
      if (i >= chunks.size()) return;
      Chunk& c = chunks[i];
      const RawWrite& job = jobs[c.job];
      const auto* p = static_cast<const unsigned char*>(job.src) + c.begin;
      c.crc = crc32c(p, c.bytes);
      std::size_t done = 0;
      while (done < c.bytes) {
        ssize_t n = ::pwrite(job.fd, p + done, c.bytes - done, off_t(job.offset + c.begin + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          int err = n < 0 ? errno : ENOSPC;
          std::lock_guard<std::mutex> lock(mu);
          if (!failed.exchange(true)) error = "writing " + job.what + " failed: " + std::strerror(err);
          return;
        }
        done += std::size_t(n);
      }
      // Start writeback of this chunk now (advisory: errors surface at the final fsync).
      (void)::sync_file_range(job.fd, off_t(job.offset + c.begin), off_t(c.bytes), SYNC_FILE_RANGE_WRITE);
      if (after_chunk) after_chunk(c.job);
    }
  };
  const int t = std::min<std::size_t>(std::size_t(io_threads(requested_threads)), std::max<std::size_t>(chunks.size(), 1));
  std::vector<std::thread> threads;
  for (int i = 1; i < t; ++i) threads.emplace_back(worker);
  worker();
  for (auto& th : threads) th.join();
  DS_CHECK(!failed.load(), error);

  std::vector<std::uint32_t> crcs(jobs.size(), 0);
  for (const auto& c : chunks) crcs[c.job] = crc32c_combine(crcs[c.job], c.crc, c.bytes);
  return crcs;
}

MappedFile::MappedFile(const std::string& path) : path_(path) {
  int fd = open_regular_file(path, "checkpoint file");  // never blocks on a FIFO
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    DS_THROW("cannot stat " << path << ": " << std::strerror(err));
  }
  size_ = std::uint64_t(st.st_size);
  if (size_ > 0) {
    addr_ = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    int err = errno;
    ::close(fd);
    if (addr_ == MAP_FAILED) {
      addr_ = nullptr;
      DS_THROW("cannot map " << path << ": " << std::strerror(err));
    }
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (addr_) ::munmap(addr_, size_);
}

const unsigned char* MappedFile::range(std::uint64_t offset, std::uint64_t bytes, const std::string& what) const {
  DS_CHECK(offset <= size_ && bytes <= size_ - offset,
           what << " lies at bytes [" << offset << ", " << offset + bytes << ") but " << path_ << " has only " << size_
                << " bytes: the file is truncated");
  return data() + offset;
}

}  // namespace ds::io::detail
