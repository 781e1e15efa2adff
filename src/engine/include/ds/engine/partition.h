// Flat parameter layout and ZeRO partitioning (DeepSpeed's runtime/zero/stage_1_and_2.py).
//
// The engine lays every parameter of the module, in Module::parameters() order, end to end
// in ONE flat buffer (no per-tensor alignment). Under ZeRO stage >= 1 the flat length is
// padded with zeros to a multiple of 2*W (DeepSpeed's NCCL alignment in 16-bit elements)
// and split into W equal contiguous slices; rank r owns [r*S, (r+1)*S) with S = padded/W.
// Parameters may straddle slices. All offsets below are GLOBAL element offsets into the
// flat (padded) parameter space, so a checkpoint saved on W ranks can be re-partitioned
// for M ranks from this map alone.
//
// Stage 3 (parameters partitioned too, DeepSpeed's stage3.py) lays the space out by
// parameter GROUPS (Module::parameter_groups(); one group of everything when the module
// declares none): each group's parameters end to end, padded to a multiple of W, starting on
// a 2 MiB boundary (so a gathered group's pages, huge ones included, can be released without
// touching its neighbours; the gaps are address space only). Rank r owns piece r of every group -- [offset + r*piece, +piece) -- and keeps
// its pieces end to end in its PARTITION (partition_numel elements; group g's piece at
// part_offset). The flat space itself is only the gather target the module reads through.
// Checkpoints use the dense offsets (every parameter end to end, no padding: the same
// numbers as stages 0-2), so any stage loads any other.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ds/core/module.h"

namespace ds::engine {

struct FlatParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;        // global element offset in the flat space
  std::size_t numel = 0;
  std::size_t dense_offset = 0;  // offset with every parameter end to end (= offset below stage 3)
};

// Stage 3: one parameter group's range of the flat space and its pieces.
struct FlatGroup {
  std::string name;
  std::size_t first_param = 0, param_count = 0;  // parameters [first_param, +param_count)
  std::size_t offset = 0;        // flat offset of the group (2 MiB-aligned)
  std::size_t numel = 0;         // real elements
  std::size_t padded = 0;        // numel rounded up to a multiple of W (= W * piece)
  std::size_t piece = 0;         // each rank's share
  std::size_t part_offset = 0;   // where every rank keeps its piece in its partition
  std::size_t dense_offset = 0;  // dense offset of the group's first element
  // Real elements of rank r's piece (the padding sits at the end of the last pieces).
  std::size_t piece_real(int r) const {
    const std::size_t b = std::size_t(r) * piece;
    return b >= numel ? 0 : std::min(piece, numel - b);
  }
};

// One rank's contiguous slice of the flat space.
struct RankSlice {
  std::size_t offset = 0;      // global element offset of the slice (= rank * partition_numel)
  std::size_t count = 0;       // partition_numel (includes padding on the last rank(s))
  std::size_t real_count = 0;  // elements of the slice that are real parameters (< total_numel)
};

// The piece of one parameter tensor that lies inside one rank's slice.
struct SliceSegment {
  std::size_t param_index = 0;   // index into params
  std::size_t param_offset = 0;  // element offset inside the parameter tensor
  std::size_t slice_offset = 0;  // element offset inside the rank's slice
  std::size_t count = 0;
};

struct PartitionMap {
  int world_size = 1;
  int stage = 0;
  std::size_t total_numel = 0;      // sum of parameter numels
  std::size_t padded_numel = 0;     // total rounded up to 2*W (stages 1-2), else total;
                                    // stage 3: the end of the last group's range
  std::size_t partition_numel = 0;  // padded / W (stages 1-2), else total; stage 3: sum of pieces
  std::vector<FlatParam> params;
  std::vector<RankSlice> slices;    // one per rank (stage 0: every rank owns everything;
                                    // stage 3: offset 0, count = partition_numel)
  std::vector<FlatGroup> groups;    // stage 3 only, in Module::parameter_groups() order

  // The parameter pieces inside rank r's slice (stage 3: its partition), in order;
  // slice_offset is the element offset inside the slice / partition.
  std::vector<SliceSegment> segments(int rank) const;
  // Stage 3: the group holding parameter i.
  std::size_t group_of(std::size_t param) const;
  // Stage 3: the most elements one group spans in the flat space (padding included).
  std::size_t largest_group() const {
    std::size_t m = 0;
    for (const auto& g : groups) m = std::max(m, g.padded);
    return m;
  }
};

// Builds the map for a module's parameters. Stage 0 means "no partitioning": one slice of
// the whole space that every rank owns. Stage 3 takes the module's groups (empty: one group
// "model" of everything) and the working dtype's element size, for the 2 MiB alignment;
// groups must tile the parameters in order (ds::Error naming the group otherwise).
PartitionMap make_partition_map(const std::vector<ParamInfo>& params, int world_size, int stage,
                                const std::vector<ParamGroup>& groups = {}, std::size_t elem_bytes = 4);

}  // namespace ds::engine
