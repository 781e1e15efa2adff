// Test access to MpiComm's plain-MPI collectives: the collective tests compare the
// shared-memory window path to them bit for bit. Internal (not installed); tests add mpi/src
// to their include path.
#pragma once

#include "ds/mpi/mpi_comm.h"

namespace ds::detail {

struct MpiCommTesting {
  static void all_reduce_mpi(MpiComm& c, TensorView buf, ReduceOp op) { c.all_reduce_mpi(buf, op); }
  static void reduce_scatter_mpi(MpiComm& c, TensorView send, TensorView recv, ReduceOp op) {
    c.reduce_scatter_mpi(send, recv, op);
  }
  static void reduce_scatter_in_place_mpi(MpiComm& c, TensorView buf, std::span<const std::size_t> counts,
                                          ReduceOp op) {
    c.reduce_scatter_in_place_mpi(buf, counts, op);
  }
  static void all_gather_mpi(MpiComm& c, TensorView send, TensorView recv) { c.all_gather_mpi(send, recv); }
};

}  // namespace ds::detail
