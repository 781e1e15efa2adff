// init_distributed() under mpirun: the context's fields, a second context while MPI is up
// (it must not re-initialize), and -- run with a launcher environment that disagrees with
// MPI -- the mismatch error on every rank, ended by abort_job (the test matches the message).
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ds/core/error.h"
#include "ds/mpi/init.h"

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--claim_world_size") {
    // Pose as a torchrun-style launcher that believes in a different world size; every
    // other variable matches what mpirun set for this rank.
    const char* r = std::getenv("OMPI_COMM_WORLD_RANK");
    const char* lr = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    setenv("RANK", r ? r : "0", 1);
    setenv("LOCAL_RANK", lr ? lr : "0", 1);
    setenv("WORLD_SIZE", argv[2], 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29500", 1);
  }
  try {
    ds::DistributedContext ctx = ds::init_distributed();
    int fails = 0;
    auto check = [&](bool ok, const char* what) {
      if (!ok) {
        ++fails;
        std::fprintf(stderr, "[rank %d] FAIL: %s\n", ctx.rank, what);
      }
    };
    int r = -1, n = -1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    check(ctx.rank == r && ctx.world_size == n, "rank / size are MPI's");
    check(ctx.initialized_mpi, "we initialized MPI");
    check(ctx.thread_level == MPI_THREAD_MULTIPLE, "MPI_THREAD_MULTIPLE provided");
    check(ctx.local_size == n && ctx.local_rank == r, "one node: local rank = rank");
    check(ctx.node_rank == 0 && ctx.num_nodes == 1, "node 0 of 1");
    check(ctx.device == ctx.local_rank, "device = local rank");
    check(ctx.comm && ctx.comm->size() == n && ctx.comm->backend() == "mpi", "ctx.comm is an MpiComm of the world");
    int cmp = MPI_UNEQUAL;
    MPI_Comm_compare(ctx.mpi_comm, MPI_COMM_WORLD, &cmp);
    check(cmp == MPI_CONGRUENT, "ctx.mpi_comm is a duplicate of MPI_COMM_WORLD");
    MPI_Errhandler eh;
    MPI_Comm_get_errhandler(ctx.mpi_comm, &eh);
    check(eh == MPI_ERRORS_RETURN, "MPI_ERRORS_RETURN on our communicator");
    MPI_Errhandler_free(&eh);
    check(ds::process_rank() == r, "ds::set_process_rank called");
    {
      // MPI is up now: a second context must neither initialize nor finalize it.
      ds::DistributedContext again = ds::init_distributed();
      check(!again.initialized_mpi, "second context does not initialize MPI");
      ds::finalize_distributed(again);
      int finalized = 1;
      MPI_Finalized(&finalized);
      check(!finalized, "second context did not finalize MPI");
    }
    // A communicator kept past the context keeps MPI alive; MPI ends with the last holder.
    std::shared_ptr<ds::Communicator> keep = ctx.comm;
    ds::finalize_distributed(ctx);
    int finalized = 1;
    MPI_Finalized(&finalized);
    check(!finalized, "a held communicator keeps MPI up");
    float x = 1.0f;
    keep->all_reduce({&x, 1, ds::DType::F32}, ds::ReduceOp::Sum);
    check(x == float(n), "the held communicator still works");
    int total = 0;
    MPI_Allreduce(&fails, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    keep.reset();
    MPI_Finalized(&finalized);
    if (!finalized) {
      std::fprintf(stderr, "[rank %d] FAIL: MPI not finalized after the last holder\n", r);
      return 1;
    }
    if (r == 0) std::printf("test_init: %d ranks, %d failures\n", n, total);
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    ds::abort_job(3, std::string("test_init: error: ") + e.what());
  }
}
