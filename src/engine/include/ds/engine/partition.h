// Flat parameter layout and ZeRO partitioning (DeepSpeed's runtime/zero/stage_1_and_2.py).
//
// The engine lays every parameter of the module, in Module::parameters() order, end to end
// in ONE flat buffer (no per-tensor alignment). Under ZeRO stage >= 1 the flat length is
// padded with zeros to a multiple of 2*W (DeepSpeed's NCCL alignment in 16-bit elements)
// and split into W equal contiguous slices; rank r owns [r*S, (r+1)*S) with S = padded/W.
// Parameters may straddle slices. All offsets below are GLOBAL element offsets into the
// flat (padded) parameter space, so a checkpoint saved on W ranks can be re-partitioned
// for M ranks from this map alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ds/core/module.h"

namespace ds::engine {

struct FlatParam {
  std::string name;
  std::vector<std::int64_t> shape;
  std::size_t offset = 0;  // global element offset in the flat space
  std::size_t numel = 0;
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
  std::size_t padded_numel = 0;     // total rounded up to 2*W (stage >= 1), else total
  std::size_t partition_numel = 0;  // padded / W (stage >= 1), else total
  std::vector<FlatParam> params;
  std::vector<RankSlice> slices;    // one per rank (stage 0: every rank owns everything)

  // The parameter pieces inside rank r's slice, in flat order.
  std::vector<SliceSegment> segments(int rank) const;
};

// Builds the map for a module's parameters. Stage 0 means "no partitioning": one slice of
// the whole space that every rank owns.
PartitionMap make_partition_map(const std::vector<ParamInfo>& params, int world_size, int stage);

}  // namespace ds::engine
