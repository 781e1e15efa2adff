// The pipe x data grid (ds/pipe/topology.h): DeepSpeed's PipeDataParallelTopology arithmetic.
#include "ds/pipe/topology.h"

#include "ds/core/error.h"

namespace ds::pipe {

PipeGrid::PipeGrid(int world_size, int stages) {
  DS_CHECK(world_size >= 1, "pipeline grid: the world size must be >= 1, got " << world_size);
  DS_CHECK(stages >= 1, "pipeline grid: pipeline.stages must be >= 1, got " << stages);
  DS_CHECK(world_size % stages == 0, "pipeline grid: the world size " << world_size
                                         << " is not divisible by pipeline.stages " << stages
                                         << " (each stage needs the same number of data-parallel ranks)");
  stages_ = stages;
  data_parallel_size_ = world_size / stages;
}

int PipeGrid::rank_of(GridCoord c) const {
  DS_CHECK(c.stage >= 0 && c.stage < stages_ && c.data >= 0 && c.data < data_parallel_size_,
           "pipeline grid: coordinate (stage " << c.stage << ", data " << c.data << ") is outside the "
                                               << stages_ << " x " << data_parallel_size_ << " grid");
  return c.stage * data_parallel_size_ + c.data;
}

GridCoord PipeGrid::coord_of(int rank) const {
  DS_CHECK(rank >= 0 && rank < world_size(),
           "pipeline grid: rank " << rank << " is outside the world of " << world_size() << " ranks");
  return {rank / data_parallel_size_, rank % data_parallel_size_};
}

std::vector<int> PipeGrid::data_parallel_group(int stage) const {
  std::vector<int> ranks;
  for (int d = 0; d < data_parallel_size_; ++d) ranks.push_back(rank_of({stage, d}));
  return ranks;
}

std::vector<int> PipeGrid::pipe_group(int data) const {
  std::vector<int> ranks;
  for (int s = 0; s < stages_; ++s) ranks.push_back(rank_of({s, data}));
  return ranks;
}

std::vector<std::vector<int>> PipeGrid::data_parallel_groups() const {
  std::vector<std::vector<int>> groups;
  for (int s = 0; s < stages_; ++s) groups.push_back(data_parallel_group(s));
  return groups;
}

std::vector<std::vector<int>> PipeGrid::pipe_groups() const {
  std::vector<std::vector<int>> groups;
  for (int d = 0; d < data_parallel_size_; ++d) groups.push_back(pipe_group(d));
  return groups;
}

PipeBatch pipe_batch(const PipeGrid& grid, std::int64_t train_batch_size, std::int64_t micro_batch_size,
                     std::int64_t gradient_accumulation_steps) {
  const std::int64_t dp = grid.data_parallel_size();
  DS_CHECK(train_batch_size >= 1 && micro_batch_size >= 1 && gradient_accumulation_steps >= 1,
           "pipeline batch: train_batch_size " << train_batch_size << ", train_micro_batch_size_per_gpu "
                                               << micro_batch_size << " and gradient_accumulation_steps "
                                               << gradient_accumulation_steps << " must all be >= 1");
  DS_CHECK(train_batch_size % dp == 0,
           "pipeline batch: train_batch_size " << train_batch_size << " is not divisible by the data-parallel size "
                                               << dp << " (world size " << grid.world_size() << " / "
                                               << grid.stages() << " stages)");
  const std::int64_t per_pipe = train_batch_size / dp;
  DS_CHECK(per_pipe % micro_batch_size == 0,
           "pipeline batch: train_batch_size / data-parallel size = " << per_pipe
               << " is not divisible by train_micro_batch_size_per_gpu " << micro_batch_size);
  DS_CHECK(per_pipe / micro_batch_size == gradient_accumulation_steps,
           "pipeline batch: train_batch_size " << train_batch_size << " != train_micro_batch_size_per_gpu "
               << micro_batch_size << " x gradient_accumulation_steps " << gradient_accumulation_steps
               << " x data-parallel size " << dp << " (gradient_accumulation_steps "
               << per_pipe / micro_batch_size << " would fit)");
  return {train_batch_size, micro_batch_size, gradient_accumulation_steps, static_cast<int>(dp)};
}

}  // namespace ds::pipe
