#include "ds/data/token_shards.h"

#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/hash.h"

namespace ds::data {

namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// The first directory glob() could not read (its error callback takes no user pointer).
thread_local std::string glob_error_path;
thread_local int glob_error = 0;

int note_glob_error(const char* path, int err) {
  // A missing directory is a pattern that matches no file; a loop or no permission is not.
  if (glob_error == 0 && err != ENOENT && err != ENOTDIR) {
    glob_error_path = path;
    glob_error = err;
  }
  return 0;  // GLOB_ERR stops the expansion
}

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + (err == ELOOP ? " (a symbolic link loop)" : "");
}

// The files a pattern names, sorted by name (byte order, whatever the locale).
std::vector<std::string> expand(const std::string& pattern) {
  if (!has_glob_chars(pattern)) {
    check_regular_file(pattern, "token file");  // "does not exist" / "is a directory" name it
    return {pattern};
  }
  glob_t g{};
  glob_error = 0;
  const int rc = ::glob(pattern.c_str(), GLOB_ERR, note_glob_error, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  DS_CHECK(rc != GLOB_NOSPACE, "token data '" << pattern << "': out of memory expanding the pattern");
  DS_CHECK(rc != GLOB_ABORTED || glob_error == 0, "token data '" << pattern << "': cannot read directory '"
                                                                 << glob_error_path << "': " << errno_text(glob_error));
  DS_CHECK(!out.empty(), "token data '" << pattern << "': the pattern matches no file");
  std::sort(out.begin(), out.end());
  return out;
}

// The process's memory maps now and the most it may hold; 0 when /proc does not say.
std::pair<std::size_t, std::size_t> map_count_and_limit() {
  std::size_t limit = 0, in_use = 0;
  std::ifstream("/proc/sys/vm/max_map_count") >> limit;
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) ++in_use;
  return {in_use, limit};
}

struct Mapped {
  std::shared_ptr<const void> map;
  std::size_t size = 0;
};

// Read-only mapping of a whole regular file (shared: the ranks on a node share the pages).
Mapped map_file(const std::string& path) {
  const int fd = open_regular_file(path, "token file");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    DS_THROW("cannot stat token file " << path << ": " << std::strerror(err));
  }
  const auto size = std::size_t(st.st_size);
  if (size == 0) {
    ::close(fd);
    DS_THROW("token file '" << path << "' is empty (0 bytes)");
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping keeps the file
  DS_CHECK(p != MAP_FAILED, "token file '" << path << "': mmap of " << size << " bytes failed: " << std::strerror(err)
                                             << (err == ENOMEM ? " (each file takes one of the process's vm.max_map_count "
                                                                 "memory maps, or memory is short)"
                                                               : ""));
  Mapped m;
  m.size = size;
  m.map = std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  return m;
}

std::int32_t i32_at(const void* base, std::size_t off) {
  std::int32_t v;
  std::memcpy(&v, static_cast<const char*>(base) + off, sizeof v);
  return v;
}

bool is_llmc_magic(std::int32_t v) { return v == kLlmcMagic || v == kLlmcMagicLlama3; }
bool llmc_magic(const Mapped& m) { return m.size >= 4 && is_llmc_magic(i32_at(m.map.get(), 0)); }

TokenShards::Piece llmc_piece(const std::string& path, const Mapped& m, const std::string& first) {
  const void* b = m.map.get();
  DS_CHECK(m.size >= 4 && llmc_magic(m),
           "token file '" << path << "': wrong magic " << (m.size >= 4 ? i32_at(b, 0) : 0)
                          << " at byte offset 0, expected " << kLlmcMagic << " or " << kLlmcMagicLlama3 << " (an llm.c shard, as '"
                          << first << "' is)");
  DS_CHECK(m.size >= kLlmcHeaderBytes, "token file '" << path << "': truncated llm.c shard: " << m.size
                                                      << " bytes, the header alone is " << kLlmcHeaderBytes
                                                      << " (it ends at byte offset " << m.size << ")");
  const std::int32_t magic = i32_at(b, 0);
  const std::int32_t version = i32_at(b, 4);
  if (magic == kLlmcMagic)
    DS_CHECK(version == 1 || version == 2, "token file '" << path << "': unsupported version " << version
                                                          << " at byte offset 4 (magic " << kLlmcMagic
                                                          << ": 1 for uint16 tokens, 2 for uint32 tokens)");
  else
    DS_CHECK(version == 7, "token file '" << path << "': unsupported version " << version << " at byte offset 4 (magic "
                                          << kLlmcMagicLlama3 << ": 7 for uint32 tokens)");
  TokenShards::Piece p;
  p.width = magic == kLlmcMagic && version == 1 ? 2 : 4;
  p.header_bytes = kLlmcHeaderBytes;
  const auto count = std::uint64_t(std::uint32_t(i32_at(b, 8)));
  const std::uint64_t want = kLlmcHeaderBytes + count * std::uint64_t(p.width);
  DS_CHECK(m.size >= want, "token file '" << path << "': truncated: the header's token count " << count
                                          << " (byte offset 8) needs " << want << " bytes, the file ends at byte offset "
                                          << m.size);
  DS_CHECK(m.size == want, "token file '" << path << "': " << m.size - want << " bytes after the last token at byte offset "
                                          << want << " (the header's token count " << count << " at byte offset 8)");
  p.count = std::size_t(count);
  return p;
}

TokenShards::Piece raw_piece(const std::string& path, const Mapped& m, int width, const std::string& first) {
  DS_CHECK(!llmc_magic(m), "token file '" << path << "': starts with the llm.c magic " << i32_at(m.map.get(), 0)
                                          << " at byte offset 0 but '" << first
                                          << "' has none: give llm.c shards and raw token files separately");
  DS_CHECK(!(m.size >= 8 && std::memcmp(m.map.get(), "DSTOKENS", 8) == 0),
           "token file '" << path << "' is a DSTOKENS file (byte offset 0): give it alone as --data");
  const std::size_t rem = m.size % std::size_t(width);
  DS_CHECK(rem == 0, "token file '" << path << "': odd-sized raw file: " << m.size << " bytes is not a whole number of "
                                    << width << "-byte tokens (" << rem << " stray byte(s) at byte offset "
                                    << m.size - rem << ")");
  TokenShards::Piece p;
  p.width = width;
  p.header_bytes = 0;
  p.count = m.size / std::size_t(width);
  return p;
}

template <typename T>
std::uint32_t max_of(const TokenShards::Piece& p) {
  const T* t = reinterpret_cast<const T*>(static_cast<const char*>(p.map.get()) + p.header_bytes) + p.first;
  std::uint32_t mx = 0;
  for (std::size_t i = 0; i < p.count; ++i) mx = std::max<std::uint32_t>(mx, t[i]);
  return mx;
}

std::uint32_t piece_max(const TokenShards::Piece& p) {
  return p.width == 2 ? max_of<std::uint16_t>(p) : max_of<std::uint32_t>(p);
}

}  // namespace

bool TokenShards::has_llmc_magic(const std::string& path) {
  const int fd = open_regular_file(path, "token file");
  std::int32_t v = 0;
  const ssize_t n = ::pread(fd, &v, sizeof v, 0);
  ::close(fd);
  return n == ssize_t(sizeof v) && is_llmc_magic(v);
}

TokenShards TokenShards::open(const std::string& pattern, int raw_width) {
  DS_CHECK(raw_width == 2 || raw_width == 4, "token data '" << pattern << "': raw token width " << raw_width
                                                            << " bytes (expected 2 for uint16 or 4 for uint32)");
  TokenShards s;
  const auto files = expand(pattern);
  if (const auto [in_use, limit] = map_count_and_limit(); limit > 0) check_map_count(pattern, files.size(), in_use, limit);
  bool llmc = false;
  for (std::size_t i = 0; i < files.size(); ++i) {
    const Mapped m = map_file(files[i]);
    if (i == 0) llmc = llmc_magic(m);
    Piece p = llmc ? llmc_piece(files[i], m, files[0]) : raw_piece(files[i], m, raw_width, files[0]);
    p.map = m.map;
    p.path = files[i];
    s.total_ += p.count;
    s.pieces_.push_back(std::move(p));
  }
  return s;
}

std::uint32_t TokenShards::token(std::size_t piece, std::size_t i) const {
  const Piece& p = pieces_.at(piece);
  DS_CHECK(i < p.count, "token " << i << " out of range for '" << p.path << "' (" << p.count << " tokens)");
  const char* at = static_cast<const char*>(p.map.get()) + p.header_bytes + (p.first + i) * std::size_t(p.width);
  if (p.width == 2) {
    std::uint16_t v;
    std::memcpy(&v, at, 2);
    return v;
  }
  std::uint32_t v;
  std::memcpy(&v, at, 4);
  return v;
}

std::uint32_t TokenShards::max_token() const {
  if (max_token_ < 0) {
    std::uint32_t mx = 0;
    for (const Piece& p : pieces_) mx = std::max(mx, piece_max(p));
    max_token_ = mx;
  }
  return std::uint32_t(max_token_);
}

void TokenShards::check_map_count(const std::string& pattern, std::size_t files, std::size_t maps_in_use,
                                  std::size_t max_map_count) {
  DS_CHECK(files + maps_in_use + kMapCountReserve <= max_map_count,
           "token data '" << pattern << "': " << files << " files need " << files
                          << " memory maps (one each), but the process may hold " << max_map_count
                          << " (/proc/sys/vm/max_map_count) and holds " << maps_in_use << " already, with "
                          << kMapCountReserve << " kept free: use fewer, larger files, or raise vm.max_map_count");
}

void TokenShards::check_vocab(std::int64_t vocab_size, const std::string& what) const {
  if (std::int64_t(max_token()) < vocab_size) return;
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const Piece& p = pieces_[k];
    if (std::int64_t(piece_max(p)) < vocab_size) continue;
    for (std::size_t i = 0; i < p.count; ++i) {
      const std::uint32_t t = token(k, i);
      if (std::int64_t(t) >= vocab_size)
        DS_THROW("token file '" << p.path << "': token id " << t << " at byte offset "
                                << p.header_bytes + (p.first + i) * std::size_t(p.width) << " is >= " << what << " "
                                << vocab_size);
    }
  }
}

std::int64_t TokenShards::implied_vocab_size() const {
  check_vocab(kMaxImpliedVocab, "the largest vocab size taken from the data (set model.vocab_size for more):");
  return std::int64_t(max_token()) + 1;
}

std::pair<TokenShards, TokenShards> TokenShards::split(double val_fraction, std::size_t min_val_tokens) const {
  DS_CHECK(val_fraction >= 0.0 && val_fraction < 1.0, "validation fraction must be in [0, 1), got " << val_fraction);
  std::size_t nval = std::size_t(double(total_) * val_fraction);
  if (val_fraction > 0.0) nval = std::max(nval, min_val_tokens);
  DS_CHECK(nval < total_, "validation split of " << nval << " tokens leaves no training data (" << total_ << " tokens)");
  std::pair<TokenShards, TokenShards> out;
  std::size_t left = total_ - nval;  // tokens still to give to the training part
  for (const Piece& p : pieces_) {
    const std::size_t take = std::min(left, p.count);
    if (take > 0) {
      Piece a = p;
      a.count = take;
      out.first.pieces_.push_back(std::move(a));
      out.first.total_ += take;
    }
    if (take < p.count) {
      Piece b = p;
      b.first = p.first + take;
      b.count = p.count - take;
      out.second.pieces_.push_back(std::move(b));
      out.second.total_ += p.count - take;
    }
    left -= take;
  }
  return out;
}

void TokenShards::windows_for(std::int64_t seq) const {
  DS_CHECK(seq > 0, "sequence length must be > 0");
  if (seq_ == seq && starts_.size() == pieces_.size() + 1) return;
  starts_.assign(pieces_.size() + 1, 0);
  for (std::size_t k = 0; k < pieces_.size(); ++k) {
    const std::size_t c = pieces_[k].count;
    starts_[k + 1] = starts_[k] + (c < 2 ? 0 : (c - 1) / std::size_t(seq));
  }
  seq_ = seq;
}

std::size_t TokenShards::num_samples(std::int64_t seq) const {
  windows_for(seq);
  return starts_.back();
}

void TokenShards::sample(std::size_t index, std::int64_t seq, std::int32_t* inputs, std::int32_t* targets) const {
  windows_for(seq);
  DS_CHECK(index < starts_.back(), "sample " << index << " out of range (" << starts_.back()
                                             << " samples of length " << seq << ")");
  // The last piece whose first window is at or before `index`.
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), index) - 1;
  const auto k = std::size_t(it - starts_.begin());
  const std::size_t off = (index - *it) * std::size_t(seq);
  for (std::int64_t i = 0; i < seq; ++i) {
    inputs[i] = std::int32_t(token(k, off + std::size_t(i)));
    targets[i] = std::int32_t(token(k, off + std::size_t(i) + 1));
  }
}

std::uint64_t TokenShards::fingerprint() const {
  constexpr std::size_t kEdge = 4096;
  std::uint64_t h = kFnv1aOffset;
  for (const Piece& p : pieces_) {
    const std::uint64_t shape[2] = {p.count, std::uint64_t(p.width)};
    h = fnv1a64(shape, sizeof shape, h);
    const char* t = static_cast<const char*>(p.map.get()) + p.header_bytes + p.first * std::size_t(p.width);
    const std::size_t bytes = p.count * std::size_t(p.width);
    h = fnv1a64(t, std::min(bytes, kEdge), h);
    if (bytes > kEdge) h = fnv1a64(t + bytes - std::min(bytes - kEdge, kEdge), std::min(bytes - kEdge, kEdge), h);
  }
  return h;
}

std::vector<std::int32_t> TokenShards::head(std::size_t n) const {
  std::vector<std::int32_t> out;
  for (std::size_t k = 0; k < pieces_.size() && out.size() < n; ++k)
    for (std::size_t i = 0; i < pieces_[k].count && out.size() < n; ++i) out.push_back(std::int32_t(token(k, i)));
  return out;
}

}  // namespace ds::data
