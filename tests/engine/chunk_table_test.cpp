// The host-only arithmetic of ZeRO-2's paged gradient buffers (src/engine/src/chunk_table.h),
// which the GradReducer applies to host pages and to the device chunks of DevicePagedBuffer
// alike: the units a slice keeps, the units a reduced bucket gives back, and ChunkTable's
// record of mapped chunks. The device side itself (the driver calls) is tests/cuda's
// test_device_paged_buffer; this runs anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "chunk_table.h"
#include "ds/core/error.h"

namespace {

using ds::engine::bucket_release_range;
using ds::engine::ByteRange;
using ds::engine::ChunkTable;
using ds::engine::outside;
using ds::engine::units_covering;

TEST(ChunkArithmetic, UnitsCoveringRoundOutAndClip) {
  // 4-byte elements, 64-byte units, 1000 bytes -> 1024 mapped.
  ByteRange r = units_covering(10, 20, 4, 64, 1024);  // bytes [40, 120)
  EXPECT_EQ(r.begin, 0u);
  EXPECT_EQ(r.end, 128u);
  r = units_covering(16, 16, 4, 64, 1024);  // [64, 128): exactly one unit
  EXPECT_EQ(r.begin, 64u);
  EXPECT_EQ(r.end, 128u);
  r = units_covering(240, 10, 4, 64, 1024);  // [960, 1000) -> clipped to the mapping
  EXPECT_EQ(r.begin, 960u);
  EXPECT_EQ(r.end, 1024u);
  r = units_covering(30, 0, 2, 64, 1024);  // an empty slice covers nothing

  EXPECT_TRUE(r.empty());
}

TEST(ChunkArithmetic, OutsideSplitsAroundTheKeptRange) {
  auto [lo, hi] = outside(ByteRange{0, 1000}, ByteRange{200, 600});
  EXPECT_EQ(lo.begin, 0u);
  EXPECT_EQ(lo.end, 200u);
  EXPECT_EQ(hi.begin, 600u);
  EXPECT_EQ(hi.end, 1000u);
  std::tie(lo, hi) = outside(ByteRange{300, 500}, ByteRange{200, 600});  // inside: nothing
  EXPECT_TRUE(lo.empty());
  EXPECT_TRUE(hi.empty());
  std::tie(lo, hi) = outside(ByteRange{700, 900}, ByteRange{200, 600});  // above only
  EXPECT_TRUE(lo.empty());
  EXPECT_EQ(hi.begin, 700u);
  EXPECT_EQ(hi.end, 900u);
}

// Buckets as the GradReducer lays them: bsz elements each from the END of the space.
std::vector<std::pair<std::size_t, std::size_t>> buckets_of(std::size_t total, std::size_t bsz) {
  std::vector<std::pair<std::size_t, std::size_t>> b;
  for (std::size_t end = total; end > 0;) {
    const std::size_t begin = end > bsz ? end - bsz : 0;
    b.emplace_back(begin, end);
    end = begin;
  }
  return b;
}

// Every unit is given back exactly once, by the last bucket (in reduction order) that holds
// any byte of it -- so never while a bucket over it is still being written or reduced.
TEST(ChunkArithmetic, BucketsReleaseEveryUnitOnceAfterAllBucketsOverIt) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t es = std::size_t(1) << (rng() % 3);          // 1, 2, 4 bytes
    const std::size_t unit = std::size_t(16) << (rng() % 4);       // 16..128 bytes
    const std::size_t total = 1 + rng() % 700;                      // elements
    const std::size_t bsz = 1 + rng() % (total + 3);
    const std::size_t mapped = (total * es + unit - 1) / unit * unit;
    const auto buckets = buckets_of(total, bsz);
    std::vector<int> released_by(mapped / unit, -1);
    for (std::size_t k = 0; k < buckets.size(); ++k) {
      const ByteRange r = bucket_release_range(buckets[k].first, buckets[k].second, total, es, unit, mapped);
      if (r.empty()) continue;
      ASSERT_EQ(r.begin % unit, 0u);
      ASSERT_EQ(r.end % unit, 0u);
      for (std::size_t u = r.begin / unit; u < r.end / unit; ++u) {
        ASSERT_EQ(released_by[u], -1) << "unit " << u << " released twice (trial " << trial << ")";
        released_by[u] = int(k);
      }
    }
    for (std::size_t u = 0; u < released_by.size(); ++u) {
      ASSERT_NE(released_by[u], -1) << "unit " << u << " never released (trial " << trial << ")";
      int last_over = -1;  // the highest bucket index holding a byte of unit u
      for (std::size_t k = 0; k < buckets.size(); ++k)
        if (buckets[k].first * es < (u + 1) * unit && buckets[k].second * es > u * unit) last_over = int(k);
      if (last_over >= 0) {
        EXPECT_EQ(released_by[u], last_over) << "unit " << u << " (trial " << trial << ")";
      }
    }
  }
}

TEST(ChunkTable, CoveringRunsResidentAndAlignment) {
  ChunkTable t(1000, 128);  // 8 chunks, 1024 bytes reserved
  EXPECT_EQ(t.chunks(), 8u);
  EXPECT_EQ(t.reserved_bytes(), 1024u);
  EXPECT_EQ(t.resident_bytes(), 0u);
  EXPECT_EQ(t.covering(100, 300), (ChunkTable::Run{0, 3}));
  EXPECT_EQ(t.covering(128, 256), (ChunkTable::Run{1, 2}));
  EXPECT_EQ(t.covering(900, 5000), (ChunkTable::Run{7, 8}));  // clipped
  EXPECT_EQ(t.covering(300, 300), (ChunkTable::Run{0, 0}));   // empty

  t.set_mapped(2, true);
  t.set_mapped(2, true);  // twice: counted once
  t.set_mapped(5, true);
  EXPECT_EQ(t.resident_bytes(), 256u);
  // Runs of unmapped chunks, consecutive ones merged, mapped ones skipped.
  const std::vector<ChunkTable::Run> runs = t.unmapped_runs(0, 1024);
  const std::vector<ChunkTable::Run> want{{0, 2}, {3, 5}, {6, 8}};
  EXPECT_EQ(runs, want);
  EXPECT_EQ(t.resident_bytes(256, 640), 128u);  // chunks 2..4
  EXPECT_EQ(t.resident_bytes(0, 1024), 256u);
  EXPECT_EQ(t.mapped_in(0, 1024), (std::vector<std::size_t>{2, 5}));
  EXPECT_EQ(t.mapped_in(384, 1024), (std::vector<std::size_t>{5}));
  EXPECT_EQ(t.mapped_in(640, 5000), (std::vector<std::size_t>{5}));  // end clipped to the reservation
  EXPECT_THROW(t.mapped_in(100, 512), ds::Error);  // a release must not drop bytes outside it
  EXPECT_THROW(t.mapped_in(0, 500), ds::Error);
  EXPECT_THROW(t.resident_bytes(10, 500), ds::Error);
  t.set_mapped(2, false);
  EXPECT_EQ(t.resident_bytes(), 128u);
  EXPECT_THROW(ChunkTable(100, 0), ds::Error);
}

// A ZeRO-2 backward on the chunk record, as the GradReducer drives a DevicePagedBuffer:
// parameters report final gradients in reverse order except a tied parameter 0 that backward
// writes first and reports last (the GPT's embeddings), and one parameter may never be
// written; before writing a parameter the reducer maps its chunks unless it is final
// (acquire); each bucket, once all its parameters reported, maps what is still unmapped of
// it, is reduced and gives its units back outside the rank's slice. Checked: no chunk holding
// a gradient that was written but is not final yet is ever released (its sum would be lost,
// or a later kernel would fault on it), no bucket launches over a chunk released before, and
// after the backward only the slice's chunks stay mapped.
TEST(ChunkTable, Zero2BackwardNeverWritesAReleasedChunk) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t es = 2 + 2 * (rng() % 2), chunk = 64;
    std::vector<std::pair<std::size_t, std::size_t>> params;  // offset, numel
    std::size_t total = 0;
    const std::size_t np = 2 + rng() % 12;
    for (std::size_t i = 0; i < np; ++i) {
      const std::size_t n = 1 + rng() % 90;
      params.emplace_back(total, n);
      total += n;
    }
    const std::size_t world = 1 + rng() % 4, part = (total + world - 1) / world, rank = rng() % world;
    const std::size_t slice_off = std::min(total, rank * part), slice_n = std::min(part, total - slice_off);
    ChunkTable t(total * es, chunk);
    const ByteRange keep = units_covering(slice_off, slice_n, es, chunk, t.reserved_bytes());
    for (const auto& r : t.unmapped_runs(keep.begin, keep.end))
      for (std::size_t c = r.first; c < r.last; ++c) t.set_mapped(c, true);
    const auto buckets = buckets_of(total, 1 + rng() % (total + 5));
    std::vector<bool> ready(np, false), written(np, false);
    std::vector<bool> released(t.chunks(), false);  // given back at least once
    const std::size_t unused = rng() % (np + 3);    // a parameter backward never writes (or none)
    std::size_t next = 0;  // buckets reduce strictly in order
    auto write = [&](std::size_t i) {  // acquire, then the kernel writes parameter i
      const ByteRange r = units_covering(params[i].first, params[i].second, es, chunk, t.reserved_bytes());
      for (const auto& run : t.unmapped_runs(r.begin, r.end))
        for (std::size_t c = run.first; c < run.last; ++c) t.set_mapped(c, true);
      written[i] = true;
    };
    auto report = [&](std::size_t i) {
      ready[i] = true;
      while (next < buckets.size()) {
        const auto [b, e] = buckets[next];
        bool all = true;
        for (std::size_t j = 0; j < np; ++j)
          if (params[j].first < e && params[j].first + params[j].second > b && !ready[j]) all = false;
        if (!all) break;
        // Launch: the reduction covers the whole bucket, so its unwritten chunks are mapped
        // now -- none of them may have been released before (its contents would be lost).
        const ByteRange whole = units_covering(b, e - b, es, chunk, t.reserved_bytes());
        for (std::size_t c = whole.begin / chunk; c < whole.end / chunk; ++c) {
          ASSERT_FALSE(released[c]) << "trial " << trial << ": bucket " << b << ".." << e << " launched over chunk "
                                    << c << ", already released";
          t.set_mapped(c, true);
        }
        // Reduced: its units go back outside the slice.
        const ByteRange r = bucket_release_range(b, e, total, es, chunk, t.reserved_bytes());
        const auto [lo, hi] = outside(r, keep);
        for (ByteRange x : {lo, hi})
          for (std::size_t c : t.mapped_in(x.begin, x.end)) {
            t.set_mapped(c, false);
            released[c] = true;
          }
        ++next;
        // A gradient written but not final yet (not reduced) must keep every chunk it sits in.
        for (std::size_t j = 0; j < np; ++j) {
          if (ready[j] || !written[j]) continue;
          const ByteRange pr = units_covering(params[j].first, params[j].second, es, chunk, t.reserved_bytes());
          for (std::size_t c = pr.begin / chunk; c < pr.end / chunk; ++c)
            ASSERT_TRUE(t.mapped(c)) << "trial " << trial << ": chunk " << c << " of unfinished parameter " << j
                                     << " was released (es " << es << ", param " << params[j].first << "+"
                                     << params[j].second << ", bucket " << b << ".." << e << ", released ["
                                     << r.begin << ", " << r.end << "), keep [" << keep.begin << ", " << keep.end
                                     << "), total " << total << ")";
        }
      }
    };
    write(0);  // the tied head writes parameter 0's gradient first
    for (std::size_t i = np; i-- > 1;) {
      if (i != unused) write(i);
      report(i);
    }
    write(0);
    report(0);
    ASSERT_EQ(next, buckets.size());
    EXPECT_EQ(t.resident_bytes(), keep.size()) << "trial " << trial;
    for (std::size_t c = 0; c < t.chunks(); ++c)
      EXPECT_EQ(t.mapped(c), c * chunk >= keep.begin && c * chunk < keep.end) << "trial " << trial << " chunk " << c;
  }
}

}  // namespace
