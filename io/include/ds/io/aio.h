// Swap files and asynchronous block I/O for NVMe offload (docs/dev/offload.md).
//
// The engine keeps a rank's fp32 master and optimizer state in swap files and streams them
// through the optimizer in sub-groups: read sub-group i+1 while stepping i while writing back
// i-1. DeepSpeed does this with libaio; here a pool of threads runs pread/pwrite on files
// opened with O_DIRECT (no page cache: the data goes straight between the caller's aligned
// buffers and the device), which needs no extra library and gives the same queue-depth
// parallelism on an NVMe drive.
#pragma once

#include <sys/types.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ds::io {

constexpr std::size_t kDirectAlign = 4096;  // O_DIRECT offset/length/address alignment

// The aio section of the config (block_size bytes per request, queue_depth requests in flight
// per thread, thread_count threads).
struct AioOptions {
  std::size_t block_size = 1 << 20;
  int queue_depth = 8;
  int thread_count = 1;
};

// Rounds n up to a multiple of kDirectAlign.
constexpr std::size_t align_up(std::size_t n) { return (n + kDirectAlign - 1) / kDirectAlign * kDirectAlign; }

// Owned host memory aligned to kDirectAlign (size rounded up to it), zero-filled; move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(std::size_t bytes);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }  // the rounded-up size
  template <class T> T* as() const { return static_cast<T*>(data_); }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// One swap file opened O_RDWR|O_CREAT|O_TRUNC with O_DIRECT (where the file system refuses
// O_DIRECT, e.g. EINVAL on some tmpfs/overlay: buffered, and direct() says so). create()
// reserves `bytes` (rounded up to kDirectAlign) with posix_fallocate so that a full disk fails
// here, not in the middle of a step:
//   "<path>: cannot reserve N bytes (No space left on device); free space on <dir> or point
//    nvme_path elsewhere"
// The destructor closes the file (and unlinks it when remove_on_close). Move-only.
// try_direct = false keeps it buffered (the path the fallback takes; tests use it).
class SwapFile {
 public:
  static SwapFile create(const std::string& path, std::size_t bytes, bool remove_on_close = true,
                         bool try_direct = true);
  SwapFile() = default;
  ~SwapFile();
  SwapFile(SwapFile&& o) noexcept;
  SwapFile& operator=(SwapFile&& o) noexcept;
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::size_t bytes() const { return bytes_; }  // the reserved (rounded-up) size
  bool direct() const { return direct_; }

 private:
  void close_now() noexcept;
  int fd_ = -1;
  std::string path_;
  std::size_t bytes_ = 0;
  bool direct_ = false;
  bool remove_on_close_ = true;
};

using Ticket = std::uint64_t;

// A pool of thread_count x queue_depth I/O threads (at least 1). read/write split a request
// into block_size pieces and queue them; the threads run pread/pwrite (retrying short
// transfers and EINTR). On a direct file the offset and the memory address must be aligned to
// kDirectAlign (DS_CHECK naming the file and offset) and the length is rounded up to it (the
// caller's buffers are AlignedBuffers, whose sizes are rounded up); read_unaligned /
// write_unaligned handle everything else.
// Thread-safety: one thread submits and waits (the engine's); the pool's threads only run
// requests.
class AioQueue {
 public:
  explicit AioQueue(const AioOptions& o);
  ~AioQueue();  // waits for the requests in flight (their errors are dropped), joins the threads
  AioQueue(const AioQueue&) = delete;
  AioQueue& operator=(const AioQueue&) = delete;

  Ticket read(const SwapFile& f, std::size_t offset, std::size_t bytes, void* dst);
  Ticket write(const SwapFile& f, std::size_t offset, std::size_t bytes, const void* src);
  // The memory and the SwapFile must outlive the request: declare the AioQueue after the
  // buffers and files it serves, so that it is destroyed (and drained) first.
  // Blocks until request t (all its pieces) is done; throws ds::Error on its failure:
  //   "<path>: write of N bytes at offset O failed at offset P: <strerror>" (P: the first
  //   piece that failed; ENOSPC adds "; the disk is full"; a read past the file's end says
  //   "the file ends before it"). A ticket already waited for (or never issued) returns at once.
  void wait(Ticket t);
  void wait_all();  // every request; throws the first failure among them

  // Synchronous, any alignment: through an internal aligned bounce buffer (read-modify-write
  // of the partial blocks for writes). Waits for nothing else in flight.
  void read_unaligned(const SwapFile& f, std::size_t offset, std::size_t bytes, void* dst);
  void write_unaligned(const SwapFile& f, std::size_t offset, std::size_t bytes, const void* src);

  std::size_t bytes_read() const;     // totals of completed transfers, for benchmarks
  std::size_t bytes_written() const;
  int threads() const { return int(threads_.size()); }

 private:
  struct Piece {
    Ticket ticket = 0;
    int fd = -1;
    bool write = false;
    std::size_t offset = 0;
    std::size_t bytes = 0;
    std::size_t need = 0;  // of `bytes`, what the file must hold (the rest is direct-I/O padding)
    char* mem = nullptr;
  };
  struct Request {
    std::size_t pieces_left = 0;
    int error = 0;  // the first piece's errno (0: fine; -1: end of file on a read)
    std::size_t error_offset = 0;
    std::size_t bytes = 0;
    std::size_t offset = 0;
    bool write = false;
    std::string path;
  };
  Ticket submit(const SwapFile& f, bool write, std::size_t offset, std::size_t bytes, char* mem);
  void sync_io(const SwapFile& f, bool write, std::size_t offset, std::size_t bytes, char* mem);
  void worker();
  void run_piece(const Piece& p);
  [[noreturn]] void throw_failure(const Request& r) const;

  AioOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // pieces queued / stopping
  std::condition_variable done_cv_;  // a request finished
  std::deque<Piece> queue_;
  std::unordered_map<Ticket, Request> requests_;  // issued and not yet waited for
  Ticket next_ = 1;
  bool stop_ = false;
  std::size_t bytes_read_ = 0, bytes_written_ = 0;
  std::vector<std::thread> threads_;
  AlignedBuffer bounce_;  // read_unaligned / write_unaligned
};

}  // namespace ds::io
