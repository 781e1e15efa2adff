#include "ds/mpi/communicator.h"

#include "ds/core/error.h"

namespace ds {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
  }
  return "unknown-op";
}

std::size_t in_place_block_offset(std::span<const std::size_t> counts, int size, int rank, std::size_t total,
                                  std::string_view who) {
  if (counts.size() != static_cast<std::size_t>(size))
    DS_THROW(who << "::reduce_scatter_in_place: " << counts.size() << " block counts for " << size << " ranks");
  std::size_t own = 0, sum = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    if (r == static_cast<std::size_t>(rank)) own = sum;
    sum += counts[r];
  }
  if (sum != total)
    DS_THROW(who << "::reduce_scatter_in_place: the block counts sum to " << sum << ", buf.count is " << total);
  return own;
}

}  // namespace ds
