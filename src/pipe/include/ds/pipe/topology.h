// The pipe x data rank grid of pipeline parallelism, laid out as DeepSpeed's
// PipeDataParallelTopology (runtime/pipe/topology.py): axes ['pipe', 'data'] in row-major
// order, so rank = stage * data_parallel_size + data_index and the data-parallel peers of a
// stage hold adjacent ranks (their gradient reductions stay on fast intra-node links; the
// lighter point-to-point traffic between stages crosses nodes).
//
// Pure arithmetic, no communicator: the engine builds its sub-communicators from these lists.
#pragma once

#include <cstdint>
#include <vector>

namespace ds::pipe {

struct GridCoord {
  int stage = 0;  // the 'pipe' axis
  int data = 0;   // the 'data' axis
  bool operator==(const GridCoord&) const = default;
};

class PipeGrid {
 public:
  // world_size ranks split into `stages` pipeline stages; throws ds::Error when a value is
  // below 1 or stages does not divide world_size (the message names both numbers).
  PipeGrid(int world_size, int stages);

  int world_size() const { return stages_ * data_parallel_size_; }
  int stages() const { return stages_; }
  int data_parallel_size() const { return data_parallel_size_; }

  // rank <-> coordinates; out-of-range inputs throw ds::Error naming the value and the grid.
  int rank_of(GridCoord coord) const;
  GridCoord coord_of(int rank) const;

  // The ranks of stage `stage`'s data-parallel group (they reduce gradients together),
  // ascending: DeepSpeed's get_axis_comm_lists('data')[stage].
  std::vector<int> data_parallel_group(int stage) const;
  // The ranks of pipe `data` (stage 0 to the last, one per stage): get_axis_comm_lists('pipe')[data].
  std::vector<int> pipe_group(int data) const;
  // Every stage's data-parallel group, by stage; every pipe, by data index.
  std::vector<std::vector<int>> data_parallel_groups() const;
  std::vector<std::vector<int>> pipe_groups() const;

 private:
  int stages_ = 1;
  int data_parallel_size_ = 1;
};

// DeepSpeed's batch rule with a pipeline: each step feeds every pipe
// gradient_accumulation_steps micro-batches, so
//   train_batch_size = micro_batch x gradient_accumulation_steps x data_parallel_size
// and the schedules run micro_batches() = gradient_accumulation_steps micro-batches per step.
struct PipeBatch {
  std::int64_t train_batch_size = 0;
  std::int64_t micro_batch_size = 0;
  std::int64_t gradient_accumulation_steps = 0;
  int data_parallel_size = 1;
  std::int64_t micro_batches() const { return gradient_accumulation_steps; }
};

// Checks the rule for `grid`: every value >= 1 and the product equal; the error names the
// values and what does not divide (train_batch_size by data_parallel_size, then by the micro
// batch).
PipeBatch pipe_batch(const PipeGrid& grid, std::int64_t train_batch_size, std::int64_t micro_batch_size,
                     std::int64_t gradient_accumulation_steps);

}  // namespace ds::pipe
