// The collective deadline of MpiComm, under mpirun -np 2 (driven by comm_timeout.sh):
//   test_comm_timeout SECONDS stop   rank 1 stops itself (SIGSTOP) before all_reduce #2; rank 0
//                                    must end the job with the "comm timeout" line
//   test_comm_timeout SECONDS late   rank 1 arrives 0.5 s late at every collective: no timeout
// DS_TEST_PID_DIR=d: each rank writes d/<rank>.pid first (the script cleans up by pid).
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <vector>

#include "ds/mpi/init.h"
#include "ds/mpi/mpi_comm.h"

namespace {

int run(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: test_comm_timeout SECONDS stop|late\n");
    return 2;
  }
  const double seconds = std::atof(argv[1]);
  const std::string mode = argv[2];
  ds::DistributedContext ctx = ds::init_distributed();
  if (const char* dir = std::getenv("DS_TEST_PID_DIR")) {
    const std::string path = std::string(dir) + "/" + std::to_string(ctx.rank) + ".pid";
    if (std::FILE* f = std::fopen(path.c_str(), "w")) {
      std::fprintf(f, "%d\n", static_cast<int>(getpid()));
      std::fclose(f);
    }
  }
  ctx.comm->set_timeout(seconds);
  float x = 1.0f;
  ds::TensorView v{&x, 1, ds::DType::F32};
  ctx.comm->all_reduce(v, ds::ReduceOp::Sum);  // #1: everyone arrives
  if (mode == "stop") {
    if (ctx.rank == 1) raise(SIGSTOP);
    ctx.comm->all_reduce(v, ds::ReduceOp::Sum);  // #2: rank 1 never comes
    // (Rank 1 may get here when the job's teardown continues it: SIGCONT before the kill.)
    if (ctx.rank == 0) std::printf("rank 0: all_reduce #2 returned although rank 1 is stopped\n");
    return 3;
  }
  // late: every kind of collective, rank 1 always 0.5 s behind; nothing times out.
  std::vector<float> big(1 << 16, 1.0f), part(big.size() / 2), all(big.size() * 2);
  for (int i = 0; i < 2; ++i) {
    if (ctx.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ctx.comm->all_reduce(v, ds::ReduceOp::Sum);
    ctx.comm->all_reduce(ds::TensorView{big.data(), big.size(), ds::DType::F32}, ds::ReduceOp::Sum);
    ctx.comm->reduce_scatter(ds::TensorView{big.data(), big.size(), ds::DType::F32},
                             ds::TensorView{part.data(), part.size(), ds::DType::F32}, ds::ReduceOp::Sum);
    ctx.comm->all_gather(ds::TensorView{big.data(), big.size(), ds::DType::F32},
                         ds::TensorView{all.data(), all.size(), ds::DType::F32});
    ds::CommWork w = ctx.comm->iall_reduce(ds::TensorView{big.data(), big.size(), ds::DType::F32}, ds::ReduceOp::Sum);
    w->wait();
    ctx.comm->broadcast(v, 0);
    ctx.comm->barrier();
  }
  std::printf("rank %d: late peer ok\n", ctx.rank);
  ds::finalize_distributed(ctx);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    ds::abort_job(1, std::string("test_comm_timeout: error: ") + e.what());
  }
}
