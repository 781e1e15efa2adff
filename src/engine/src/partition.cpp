#include "ds/engine/partition.h"

#include <algorithm>

#include "ds/core/error.h"

namespace ds::engine {

PartitionMap make_partition_map(const std::vector<ParamInfo>& params, int world_size, int stage) {
  DS_CHECK(world_size >= 1, "world size must be >= 1, got " << world_size);
  DS_CHECK(stage >= 0 && stage <= 2,
           "zero_optimization.stage " << stage << " is not supported (dstrain implements stages 0, 1 and 2)");
  PartitionMap m;
  m.world_size = world_size;
  m.stage = stage;
  std::size_t off = 0;
  for (const auto& p : params) {
    for (auto d : p.shape) DS_CHECK(d >= 0, "parameter '" << p.name << "' has a negative dimension");
    FlatParam fp{p.name, p.shape, off, p.numel()};
    off += fp.numel;
    m.params.push_back(std::move(fp));
  }
  m.total_numel = off;
  if (stage == 0) {
    m.padded_numel = off;
    m.partition_numel = off;
    m.slices.assign(std::size_t(world_size), RankSlice{0, off, off});
    return m;
  }
  const std::size_t align = 2 * std::size_t(world_size);
  m.padded_numel = std::max<std::size_t>(align, (off + align - 1) / align * align);
  m.partition_numel = m.padded_numel / std::size_t(world_size);
  for (int r = 0; r < world_size; ++r) {
    RankSlice s;
    s.offset = std::size_t(r) * m.partition_numel;
    s.count = m.partition_numel;
    const std::size_t end = std::min(s.offset + s.count, m.total_numel);
    s.real_count = end > s.offset ? end - s.offset : 0;
    m.slices.push_back(s);
  }
  return m;
}

std::vector<SliceSegment> PartitionMap::segments(int rank) const {
  DS_CHECK(rank >= 0 && rank < int(slices.size()), "rank " << rank << " outside the partition map");
  const RankSlice& s = slices[std::size_t(rank)];
  std::vector<SliceSegment> out;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::size_t a = std::max(params[i].offset, s.offset);
    const std::size_t b = std::min(params[i].offset + params[i].numel, s.offset + s.count);
    if (a >= b) continue;
    out.push_back(SliceSegment{i, a - params[i].offset, a - s.offset, b - a});
  }
  return out;
}

}  // namespace ds::engine
