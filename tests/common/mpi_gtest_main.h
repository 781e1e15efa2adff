// main() for a GoogleTest binary run under mpirun: every rank runs every test, and the exit
// status is the worst over the ranks (a failure on any rank fails the job on all of them).
// `world` holds COMM_WORLD while the tests run. Include from exactly one file of the binary:
//   int main(int argc, char** argv) { return ds::test::mpi_gtest_main(argc, argv, g_world); }
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "ds/mpi/communicator.h"
#include "ds/mpi/init.h"

namespace ds::test {

inline int mpi_gtest_main(int argc, char** argv, std::shared_ptr<Communicator>& world) {
  ::testing::InitGoogleTest(&argc, argv);
  auto ctx = init_distributed();
  world = ctx.comm;
  int any = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world->all_reduce(TensorView{&any, 1, DType::I32}, ReduceOp::Max);
  world.reset();
  finalize_distributed(ctx);
  return any;
}

}  // namespace ds::test
