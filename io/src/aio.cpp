// AlignedBuffer, SwapFile and AioQueue (ds/io/aio.h).
#include "ds/io/aio.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>
#include <utility>

#include "ds/core/error.h"

namespace ds::io {

namespace {

constexpr int kEndOfFile = -1;  // a read found the file shorter than the request

bool aligned(std::size_t v) { return v % kDirectAlign == 0; }
bool aligned(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % kDirectAlign == 0; }

// Moves [offset, offset + bytes) between mem and the file, retrying EINTR and short
// transfers. Returns 0, an errno, or kEndOfFile; *done holds the bytes moved. A read that
// reaches the end of the file after `need` bytes zero-fills the rest (the padding of a direct
// read rounded up past the file's end) and succeeds.
int transfer(int fd, bool write, char* mem, std::size_t bytes, std::size_t offset, std::size_t need,
             std::size_t* done) {
  std::size_t d = 0;
  while (d < bytes) {
    const ssize_t n = write ? ::pwrite(fd, mem + d, bytes - d, off_t(offset + d))
                            : ::pread(fd, mem + d, bytes - d, off_t(offset + d));
    if (n < 0) {
      if (errno == EINTR) continue;
      // A direct read continuing at an unaligned offset after a short read at the file's end.
      if (!write && errno == EINVAL && d > 0 && !aligned(offset + d)) break;
      *done = d;
      return errno;
    }
    if (n == 0) {
      if (write) {  // no progress and no error: report it instead of spinning
        *done = d;
        return EIO;
      }
      break;
    }
    d += std::size_t(n);
  }
  *done = d;
  if (d < bytes) {
    if (d < need) return kEndOfFile;
    std::memset(mem + d, 0, bytes - d);
  }
  return 0;
}

std::string describe(int err) {
  if (err == kEndOfFile) return "the file ends before it";
  std::string s = std::strerror(err);
  if (err == ENOSPC) s += "; the disk is full";
  return s;
}

}  // namespace

// ---- AlignedBuffer ----

AlignedBuffer::AlignedBuffer(std::size_t bytes) : bytes_(align_up(bytes)) {
  if (bytes_ == 0) return;
  data_ = std::aligned_alloc(kDirectAlign, bytes_);
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, bytes_);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

// ---- SwapFile ----

SwapFile SwapFile::create(const std::string& path, std::size_t bytes, bool remove_on_close, bool try_direct) {
  SwapFile f;
  f.path_ = path;
  f.bytes_ = align_up(bytes);
  f.remove_on_close_ = remove_on_close;
  // Opened buffered first: glibc's posix_fallocate falls back to writing a byte per block on
  // file systems without fallocate, which an O_DIRECT descriptor would refuse.
  f.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (f.fd_ < 0) DS_THROW(path << ": cannot create swap file: " << std::strerror(errno));
  if (f.bytes_ > 0) {
    const int rc = ::posix_fallocate(f.fd_, 0, off_t(f.bytes_));
    if (rc != 0) {
      const std::string dir = std::filesystem::path(path).parent_path().string();
      f.close_now();
      if (!remove_on_close) ::unlink(path.c_str());  // a half-reserved file helps nobody
      DS_THROW(path << ": cannot reserve " << f.bytes_ << " bytes (" << std::strerror(rc) << "); free space on "
                    << (dir.empty() ? std::string(".") : dir) << " or point nvme_path elsewhere");
    }
  }
  // Then O_DIRECT, where the file system takes it: some refuse the flag (EINVAL from fcntl),
  // some accept it and refuse the first direct read, so one block is read to find out.
  const int fl = ::fcntl(f.fd_, F_GETFL);
  if (try_direct && fl >= 0 && ::fcntl(f.fd_, F_SETFL, fl | O_DIRECT) == 0) {
    f.direct_ = true;
    AlignedBuffer probe(kDirectAlign);
    ssize_t n;
    do n = ::pread(f.fd_, probe.data(), kDirectAlign, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      ::fcntl(f.fd_, F_SETFL, fl);
      f.direct_ = false;
    }
  }
  return f;
}

void SwapFile::close_now() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    if (remove_on_close_) ::unlink(path_.c_str());
  }
  fd_ = -1;
}

SwapFile::~SwapFile() { close_now(); }

SwapFile::SwapFile(SwapFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), path_(std::move(o.path_)), bytes_(o.bytes_), direct_(o.direct_),
      remove_on_close_(o.remove_on_close_) {}

SwapFile& SwapFile::operator=(SwapFile&& o) noexcept {
  if (this != &o) {
    close_now();
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
    bytes_ = o.bytes_;
    direct_ = o.direct_;
    remove_on_close_ = o.remove_on_close_;
  }
  return *this;
}

// ---- AioQueue ----

AioQueue::AioQueue(const AioOptions& o) : opt_(o) {
  DS_CHECK(o.block_size > 0 && o.queue_depth > 0 && o.thread_count > 0,
           "aio: block_size, queue_depth and thread_count must be positive (got " << o.block_size << ", "
                                                                                 << o.queue_depth << ", "
                                                                                 << o.thread_count << ")");
  opt_.block_size = align_up(o.block_size);
  const int n = std::max(1, o.thread_count * o.queue_depth);
  threads_.reserve(std::size_t(n));
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { worker(); });
}

AioQueue::~AioQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;  // the workers finish the queued pieces first
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

Ticket AioQueue::read(const SwapFile& f, std::size_t offset, std::size_t bytes, void* dst) {
  return submit(f, false, offset, bytes, static_cast<char*>(dst));
}

Ticket AioQueue::write(const SwapFile& f, std::size_t offset, std::size_t bytes, const void* src) {
  // pwrite only reads the memory; the piece keeps one pointer type for both directions.
  return submit(f, true, offset, bytes, static_cast<char*>(const_cast<void*>(src)));
}

Ticket AioQueue::submit(const SwapFile& f, bool write, std::size_t offset, std::size_t bytes, char* mem) {
  const char* op = write ? "write" : "read";
  DS_CHECK(f.fd() >= 0, (f.path().empty() ? std::string("swap file") : f.path()) << ": " << op << " of " << bytes
                                                                                   << " bytes: the file is not open");
  DS_CHECK(bytes == 0 || mem != nullptr, f.path() << ": " << op << " of " << bytes << " bytes at offset " << offset
                                                  << ": no buffer");
  std::size_t len = bytes;
  if (f.direct()) {
    DS_CHECK(aligned(offset) && aligned(mem), f.path() << ": direct " << op << " at offset " << offset
                                                       << " needs the offset and the buffer address aligned to "
                                                       << kDirectAlign << " bytes (use an AlignedBuffer, or "
                                                       << op << "_unaligned)");
    len = align_up(bytes);  // the buffer spans it: AlignedBuffer sizes are rounded up too
  }
  std::lock_guard<std::mutex> lock(mu_);
  const Ticket t = next_++;
  Request& r = requests_[t];
  r.bytes = bytes;
  r.offset = offset;
  r.write = write;
  r.path = f.path();
  for (std::size_t at = 0; at < len; at += opt_.block_size) {
    const std::size_t n = std::min(opt_.block_size, len - at);
    const std::size_t need = bytes > at ? std::min(n, bytes - at) : 0;
    queue_.push_back(Piece{t, f.fd(), write, offset + at, n, need, mem + at});
    ++r.pieces_left;
  }
  if (r.pieces_left > 0) work_cv_.notify_all();
  return t;
}

void AioQueue::worker() {
  for (;;) {
    Piece p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      p = queue_.front();
      queue_.pop_front();
    }
    std::size_t done = 0;
    const int err = transfer(p.fd, p.write, p.mem, p.bytes, p.offset, p.need, &done);
    {
      std::lock_guard<std::mutex> lock(mu_);
      (p.write ? bytes_written_ : bytes_read_) += done;
      Request& r = requests_[p.ticket];
      // The failure nearest the request's start, whichever thread saw it first.
      if (err != 0 && (r.error == 0 || p.offset + done < r.error_offset)) {
        r.error = err;
        r.error_offset = p.offset + done;
      }
      if (--r.pieces_left == 0) done_cv_.notify_all();
    }
  }
}

void AioQueue::throw_failure(const Request& r) const {
  DS_THROW(r.path << ": " << (r.write ? "write" : "read") << " of " << r.bytes << " bytes at offset " << r.offset
                  << " failed at offset " << r.error_offset << ": " << describe(r.error));
}

void AioQueue::wait(Ticket t) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = requests_.find(t);
  if (it == requests_.end()) return;
  done_cv_.wait(lock, [&] { return it->second.pieces_left == 0; });
  const Request r = std::move(it->second);
  requests_.erase(it);
  lock.unlock();
  if (r.error != 0) throw_failure(r);
}

void AioQueue::wait_all() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] {
    return std::all_of(requests_.begin(), requests_.end(), [](const auto& kv) { return kv.second.pieces_left == 0; });
  });
  // The failure of the earliest request, so the message does not depend on thread timing.
  const Request* first = nullptr;
  Ticket first_t = 0;
  for (const auto& [t, r] : requests_)
    if (r.error != 0 && (!first || t < first_t)) first = &r, first_t = t;
  const Request failed = first ? *first : Request{};
  requests_.clear();
  lock.unlock();
  if (failed.error != 0) throw_failure(failed);
}

std::size_t AioQueue::bytes_read() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_read_;
}

std::size_t AioQueue::bytes_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_written_;
}

// ---- synchronous, any alignment ----

void AioQueue::sync_io(const SwapFile& f, bool write, std::size_t offset, std::size_t bytes, char* mem) {
  const char* op = write ? "write" : "read";
  DS_CHECK(f.fd() >= 0, (f.path().empty() ? std::string("swap file") : f.path()) << ": " << op << " of " << bytes
                                                                                   << " bytes: the file is not open");
  if (bytes == 0) return;
  auto fail = [&](int err, std::size_t at) {
    Request r;
    r.path = f.path();
    r.write = write;
    r.bytes = bytes;
    r.offset = offset;
    r.error = err;
    r.error_offset = at;
    throw_failure(r);
  };
  auto account = [&](bool w, std::size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    (w ? bytes_written_ : bytes_read_) += n;
  };
  std::size_t done = 0;
  if (!f.direct()) {  // the page cache takes any alignment
    const int err = transfer(f.fd(), write, mem, bytes, offset, bytes, &done);
    account(write, done);
    if (err != 0) fail(err, offset + done);
    return;
  }
  if (bounce_.bytes() == 0) bounce_ = AlignedBuffer(std::max(opt_.block_size, kDirectAlign));
  char* b = bounce_.as<char>();
  const std::size_t end = offset + bytes;
  // Aligned windows of at most the bounce buffer's size covering [offset, end).
  for (std::size_t lo = offset / kDirectAlign * kDirectAlign; lo < end;) {
    const std::size_t hi = std::min(lo + bounce_.bytes(), align_up(end));
    const std::size_t a = std::max(lo, offset), z = std::min(hi, end);  // the caller's part
    if (!write || a != lo || z != hi) {
      // A read, or a write that covers its first or last block only in part: the blocks as
      // the file holds them (zeros past its end).
      const std::size_t first = a != lo || !write ? lo : (z / kDirectAlign) * kDirectAlign;
      const std::size_t need = write ? 0 : z - first;
      const int err = transfer(f.fd(), false, b + (first - lo), hi - first, first, need, &done);
      account(false, done);
      if (err != 0) fail(err, first + done);
    }
    if (write) {
      std::memcpy(b + (a - lo), mem + (a - offset), z - a);
      const int err = transfer(f.fd(), true, b, hi - lo, lo, hi - lo, &done);
      account(true, done);
      if (err != 0) fail(err, lo + done);
    } else {
      std::memcpy(mem + (a - offset), b + (a - lo), z - a);
    }
    lo = hi;
  }
}

void AioQueue::read_unaligned(const SwapFile& f, std::size_t offset, std::size_t bytes, void* dst) {
  sync_io(f, false, offset, bytes, static_cast<char*>(dst));
}

void AioQueue::write_unaligned(const SwapFile& f, std::size_t offset, std::size_t bytes, const void* src) {
  sync_io(f, true, offset, bytes, static_cast<char*>(const_cast<void*>(src)));
}

}  // namespace ds::io
