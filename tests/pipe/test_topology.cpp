// The pipe x data grid against DeepSpeed's PipeDataParallelTopology (runtime/pipe/topology.py):
// the rank lists below are what its get_axis_comm_lists('data' / 'pipe') return for the same
// dims, and the batch rule's errors name what does not divide.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/pipe/topology.h"

using ds::pipe::GridCoord;
using ds::pipe::PipeGrid;

namespace {

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ds::Error& e) {
    return e.message();
  }
  return {};
}

}  // namespace

TEST(PipeGrid, DataParallelPeersAreAdjacent) {
  const PipeGrid g(8, 2);  // PipeDataParallelTopology(num_pp=2, num_dp=4)
  EXPECT_EQ(g.data_parallel_size(), 4);
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(g.data_parallel_groups(), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(g.pipe_groups(), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(g.coord_of(5), (GridCoord{1, 1}));
  EXPECT_EQ(g.rank_of({1, 3}), 7);
}

TEST(PipeGrid, RankAndCoordinatesRoundTrip) {
  for (int stages : {1, 2, 3, 6}) {
    const PipeGrid g(6, stages);
    for (int r = 0; r < 6; ++r) {
      const GridCoord c = g.coord_of(r);
      EXPECT_EQ(g.rank_of(c), r);
      // Each rank is in exactly its stage's data group and its data index's pipe.
      EXPECT_EQ(g.data_parallel_group(c.stage)[c.data], r);
      EXPECT_EQ(g.pipe_group(c.data)[c.stage], r);
    }
  }
}

TEST(PipeGrid, FourStagesOneDataRank) {
  const PipeGrid g(4, 4);
  using Groups = std::vector<std::vector<int>>;
  EXPECT_EQ(g.data_parallel_groups(), (Groups{{0}, {1}, {2}, {3}}));
  EXPECT_EQ(g.pipe_groups(), (Groups{{0, 1, 2, 3}}));
}

TEST(PipeGrid, ErrorsNameWhatDoesNotDivide) {
  EXPECT_EQ(error_of([] { PipeGrid(6, 4); }),
            "pipeline grid: the world size 6 is not divisible by pipeline.stages 4 (each stage needs the same "
            "number of data-parallel ranks)");
  EXPECT_NE(error_of([] { PipeGrid(4, 0); }).find("pipeline.stages must be >= 1, got 0"), std::string::npos);
  EXPECT_NE(error_of([] { PipeGrid(4, 2).coord_of(4); }).find("rank 4 is outside the world of 4 ranks"),
            std::string::npos);
  EXPECT_NE(error_of([] { PipeGrid(4, 2).rank_of({2, 0}); }).find("(stage 2, data 0) is outside the 2 x 2 grid"),
            std::string::npos);
}

TEST(PipeBatch, MicroBatchesPerStepAreTheAccumulationSteps) {
  const PipeGrid g(8, 2);  // data-parallel size 4
  const auto b = ds::pipe::pipe_batch(g, 64, 2, 8);
  EXPECT_EQ(b.micro_batches(), 8);
  EXPECT_EQ(b.data_parallel_size, 4);
}

TEST(PipeBatch, ErrorsNameWhatDoesNotDivide) {
  const PipeGrid g(8, 2);
  EXPECT_EQ(error_of([&] { ds::pipe::pipe_batch(g, 30, 2, 4); }),
            "pipeline batch: train_batch_size 30 is not divisible by the data-parallel size 4 (world size 8 / 2 "
            "stages)");
  EXPECT_EQ(error_of([&] { ds::pipe::pipe_batch(g, 36, 2, 4); }),
            "pipeline batch: train_batch_size / data-parallel size = 9 is not divisible by "
            "train_micro_batch_size_per_gpu 2");
  EXPECT_EQ(error_of([&] { ds::pipe::pipe_batch(g, 32, 2, 8); }),
            "pipeline batch: train_batch_size 32 != train_micro_batch_size_per_gpu 2 x gradient_accumulation_steps 8 "
            "x data-parallel size 4 (gradient_accumulation_steps 4 would fit)");
}
