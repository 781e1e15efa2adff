// The arithmetic of a paged gradient buffer, host-only (no CUDA): ZeRO-2's byte ranges -- the
// units kept for this rank's slice, the units a reduced bucket gives back, the units backward
// is about to write -- and ChunkTable, the record of which fixed-size chunks of a device
// paged buffer (device_paged_buffer.h) have physical memory mapped. The unit is the host
// page for HostParamStore's PagedBuffer and the device chunk (the CUDA allocation granularity)
// for DeviceParamStore; the GradReducer uses the same functions for both, so this is where the
// rules are, and tests/engine/chunk_table_test.cpp checks them on the CPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "ds/core/error.h"

namespace ds::engine {

// Bytes [begin, end) of a buffer; empty when end <= begin.
struct ByteRange {
  std::size_t begin = 0, end = 0;
  bool empty() const { return end <= begin; }
  std::size_t size() const { return empty() ? 0 : end - begin; }
};

inline std::size_t round_down(std::size_t x, std::size_t unit) { return x / unit * unit; }
inline std::size_t round_up(std::size_t x, std::size_t unit) { return (x + unit - 1) / unit * unit; }

// The units holding any byte of elements [offset, offset + count) (`es` bytes each), clipped
// to `mapped` (the buffer's size rounded up to units): what stays resident for this rank's
// ZeRO-2 slice, and what backward writes for a parameter.
inline ByteRange units_covering(std::size_t offset, std::size_t count, std::size_t es, std::size_t unit,
                                std::size_t mapped) {
  if (count == 0) return {};  // no bytes, no units
  return {round_down(offset * es, unit), std::min(mapped, round_up((offset + count) * es, unit))};
}

// What the reduced bucket of elements [begin, end) gives back (of a flat space of `total`
// elements): from the first unit boundary at or after its first byte to the first at or after
// its end; the bucket at the start of the space from 0, the one at its end up to `mapped`. A
// unit shared with the next bucket in memory (lower addresses, reduced LATER: buckets are laid
// from the end of the space) therefore goes with that bucket, one shared with the previous
// bucket (already reduced) goes now, and the buckets together cover [0, mapped) exactly once.
// So a unit is given back only once every bucket that overlaps it has been reduced.
inline ByteRange bucket_release_range(std::size_t begin, std::size_t end, std::size_t total, std::size_t es,
                                      std::size_t unit, std::size_t mapped) {
  return {begin == 0 ? 0 : round_up(begin * es, unit), end == total ? mapped : round_up(end * es, unit)};
}

// The parts of `r` below and above `keep` (either may be empty).
inline std::pair<ByteRange, ByteRange> outside(ByteRange r, ByteRange keep) {
  return {ByteRange{r.begin, std::max(r.begin, std::min(r.end, keep.begin))},
          ByteRange{std::max(r.begin, keep.end), r.end}};
}

// Which chunks of a reserved range of `chunks() * chunk_bytes()` bytes have memory mapped.
class ChunkTable {
 public:
  // A run of consecutive chunks [first, last).
  struct Run {
    std::size_t first = 0, last = 0;
    bool operator==(const Run&) const = default;
  };

  ChunkTable() = default;
  // Room for `bytes` (rounded up to whole chunks), nothing mapped.
  ChunkTable(std::size_t bytes, std::size_t chunk) : chunk_(chunk) {
    DS_CHECK(chunk > 0, "ChunkTable: chunk size 0");
    mapped_.assign(round_up(bytes, chunk) / chunk, 0);
  }

  std::size_t chunk_bytes() const { return chunk_; }
  std::size_t chunks() const { return mapped_.size(); }
  std::size_t reserved_bytes() const { return mapped_.size() * chunk_; }
  bool mapped(std::size_t c) const { return mapped_[c] != 0; }
  void set_mapped(std::size_t c, bool m) {
    if (mapped(c) == m) return;
    mapped_[c] = m ? 1 : 0;
    if (m) ++resident_;
    else --resident_;
  }

  // Chunks holding any byte of [begin, end) (end clipped to reserved_bytes()).
  Run covering(std::size_t begin, std::size_t end) const {
    end = std::min(end, reserved_bytes());
    if (end <= begin) return {};
    return {begin / chunk_, round_up(end, chunk_) / chunk_};
  }

  // The chunks of covering(begin, end) not mapped yet, as runs of consecutive chunks.
  std::vector<Run> unmapped_runs(std::size_t begin, std::size_t end) const {
    std::vector<Run> out;
    const Run r = covering(begin, end);
    for (std::size_t c = r.first; c < r.last; ++c) {
      if (mapped(c)) continue;
      if (!out.empty() && out.back().last == c) out.back().last = c + 1;
      else out.push_back({c, c + 1});
    }
    return out;
  }

  // The mapped chunks of [begin, end), which must start on a chunk boundary and end on one or
  // at reserved_bytes() (a release never drops a chunk holding bytes outside the range).
  std::vector<std::size_t> mapped_in(std::size_t begin, std::size_t end) const {
    end = std::min(end, reserved_bytes());
    std::vector<std::size_t> out;
    if (end <= begin) return out;
    DS_CHECK(begin % chunk_ == 0 && end % chunk_ == 0,
             "device paged buffer: release of [" << begin << ", " << end << ") is not on " << chunk_
                                                 << "-byte chunk boundaries");
    for (std::size_t c = begin / chunk_; c < end / chunk_; ++c)
      if (mapped(c)) out.push_back(c);
    return out;
  }

  // Bytes of the mapped chunks among those holding [begin, end) (begin on a chunk boundary,
  // as PagedBuffer::resident_bytes asks of pages).
  std::size_t resident_bytes(std::size_t begin, std::size_t end) const {
    DS_CHECK(begin % chunk_ == 0, "device paged buffer: resident_bytes from " << begin << ", not a chunk boundary");
    const Run r = covering(begin, end);
    std::size_t n = 0;
    for (std::size_t c = r.first; c < r.last; ++c) n += mapped_[c];
    return n * chunk_;
  }
  std::size_t resident_bytes() const { return resident_ * chunk_; }

 private:
  std::size_t chunk_ = 1;
  std::vector<std::uint8_t> mapped_;  // one per chunk: 1 while memory is mapped there
  std::size_t resident_ = 0;          // mapped chunks
};

}  // namespace ds::engine
