#include "ds/engine/partition.h"

#include <algorithm>

#include "ds/core/error.h"
#include "ds/engine/memory.h"

namespace ds::engine {

namespace {

// Stage 3: groups padded to W, page-aligned in the flat space; pieces end to end in the partition.
void layout_groups(PartitionMap& m, const std::vector<ParamGroup>& declared, std::size_t elem_bytes) {
  std::vector<ParamGroup> groups = declared;
  if (groups.empty()) groups.push_back(ParamGroup{"model", 0, m.params.size()});
  std::size_t next = 0;
  for (const auto& g : groups) {
    DS_CHECK(g.count > 0 && g.first == next && g.first + g.count <= m.params.size(),
             "parameter group '" << g.name << "' (parameters " << g.first << ".." << g.first + g.count
             << ") does not continue the groups before it: Module::parameter_groups() must tile parameters() "
                "in order (the next group starts at parameter " << next << " of " << m.params.size() << ")");
    next = g.first + g.count;
  }
  DS_CHECK(next == m.params.size(), "Module::parameter_groups() covers " << next << " of the module's "
                                    << m.params.size() << " parameters; the groups must cover them all");
  const std::size_t W = std::size_t(m.world_size);
  // Each group starts on a 2 MiB boundary: its pages (huge ones where the kernel gives them)
  // belong to it alone, so releasing it never touches a neighbour.
  const std::size_t align = std::max<std::size_t>(1, PagedBuffer::kHugePage / std::max<std::size_t>(1, elem_bytes));
  std::size_t flat = 0, part = 0, dense = 0;
  for (const auto& g : groups) {
    FlatGroup fg;
    fg.name = g.name;
    fg.first_param = g.first;
    fg.param_count = g.count;
    fg.offset = (flat + align - 1) / align * align;
    fg.dense_offset = dense;
    std::size_t off = fg.offset;
    for (std::size_t i = g.first; i < g.first + g.count; ++i) {
      m.params[i].offset = off;
      off += m.params[i].numel;
    }
    fg.numel = off - fg.offset;
    fg.piece = std::max<std::size_t>(1, (fg.numel + W - 1) / W);
    fg.padded = fg.piece * W;
    fg.part_offset = part;
    flat = fg.offset + fg.padded;
    part += fg.piece;
    dense += fg.numel;
    m.groups.push_back(std::move(fg));
  }
  m.padded_numel = flat;
  m.partition_numel = part;
  m.slices.assign(W, RankSlice{0, part, part});
}

}  // namespace

PartitionMap make_partition_map(const std::vector<ParamInfo>& params, int world_size, int stage,
                                const std::vector<ParamGroup>& groups, std::size_t elem_bytes) {
  DS_CHECK(world_size >= 1, "world size must be >= 1, got " << world_size);
  DS_CHECK(stage >= 0 && stage <= 3,
           "zero_optimization.stage " << stage << " is not supported (dstrain implements stages 0 to 3)");
  PartitionMap m;
  m.world_size = world_size;
  m.stage = stage;
  std::size_t off = 0;
  for (const auto& p : params) {
    for (auto d : p.shape) DS_CHECK(d >= 0, "parameter '" << p.name << "' has a negative dimension");
    FlatParam fp{p.name, p.shape, off, p.numel(), off};
    off += fp.numel;
    m.params.push_back(std::move(fp));
  }
  m.total_numel = off;
  if (stage == 3) {
    layout_groups(m, groups, elem_bytes);
    return m;
  }
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

std::size_t PartitionMap::group_of(std::size_t param) const {
  auto it = std::upper_bound(groups.begin(), groups.end(), param,
                             [](std::size_t i, const FlatGroup& g) { return i < g.first_param; });
  DS_CHECK(it != groups.begin() && param < params.size(), "parameter " << param << " is in no group");
  return std::size_t(it - groups.begin()) - 1;
}

std::vector<SliceSegment> PartitionMap::segments(int rank) const {
  DS_CHECK(rank >= 0 && rank < int(slices.size()), "rank " << rank << " outside the partition map");
  if (stage == 3) {  // each group's piece, at its place in the partition
    std::vector<SliceSegment> out;
    for (const auto& g : groups) {
      const std::size_t lo = g.offset + std::size_t(rank) * g.piece, hi = lo + g.piece;
      for (std::size_t i = g.first_param; i < g.first_param + g.param_count; ++i) {
        const std::size_t a = std::max(params[i].offset, lo), b = std::min(params[i].offset + params[i].numel, hi);
        if (a >= b) continue;
        out.push_back(SliceSegment{i, a - params[i].offset, g.part_offset + (a - lo), b - a});
      }
    }
    return out;
  }
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
