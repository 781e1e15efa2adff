// init_distributed(): MPI bootstrap (thread level, our own communicator, local split,
// environment check) and the runtime token that finalizes only what we initialized.
#include "ds/mpi/init.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "ds/core/log.h"
#include "check.h"
#include "ds/mpi/mpi_comm.h"

namespace ds {

namespace detail {
MpiRuntime::~MpiRuntime() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (local != MPI_COMM_NULL) MPI_Comm_free(&local);
  if (world_dup != MPI_COMM_NULL) MPI_Comm_free(&world_dup);
  if (we_initialized) MPI_Finalize();
}
}  // namespace detail

int choose_device(int local_rank, const EnvMap& env) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end() || it->second.empty()) return local_rank;
  int entries = 1;
  for (char c : it->second) entries += (c == ',');
  return local_rank % entries;
}

DistributedContext init_distributed(const InitOptions& options) {
  const EnvMap env = options.env ? *options.env : current_environment();
  DistributedContext ctx;
  ctx.env = discover_environment(env);

  auto runtime = std::make_shared<detail::MpiRuntime>();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) DS_THROW("init_distributed: MPI was already finalized in this process; it cannot be initialized again");
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) DS_THROW("init_distributed: MPI_Init_thread failed with code " << rc);
    runtime->we_initialized = true;
    ctx.initialized_mpi = true;
  }
  MPI_Query_thread(&ctx.thread_level);

  DS_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &runtime->world_dup));
  DS_MPI_CHECK(MPI_Comm_set_errhandler(runtime->world_dup, MPI_ERRORS_RETURN));
  ctx.mpi_comm = runtime->world_dup;
  DS_MPI_CHECK(MPI_Comm_rank(ctx.mpi_comm, &ctx.rank));
  DS_MPI_CHECK(MPI_Comm_size(ctx.mpi_comm, &ctx.world_size));
  set_process_rank(ctx.rank);

  DS_MPI_CHECK(MPI_Comm_split_type(ctx.mpi_comm, MPI_COMM_TYPE_SHARED, ctx.rank, MPI_INFO_NULL, &runtime->local));
  DS_MPI_CHECK(MPI_Comm_set_errhandler(runtime->local, MPI_ERRORS_RETURN));
  ctx.local_comm = runtime->local;
  DS_MPI_CHECK(MPI_Comm_rank(ctx.local_comm, &ctx.local_rank));
  DS_MPI_CHECK(MPI_Comm_size(ctx.local_comm, &ctx.local_size));

  // Node index: nodes ordered by their lowest world rank. Leaders (local rank 0) count the
  // leaders below them with an exclusive scan; the node learns it from its leader.
  int is_leader = ctx.local_rank == 0 ? 1 : 0, leaders_below = 0;
  DS_MPI_CHECK(MPI_Exscan(&is_leader, &leaders_below, 1, MPI_INT, MPI_SUM, ctx.mpi_comm));
  if (ctx.rank == 0) leaders_below = 0;  // MPI_Exscan leaves rank 0's output undefined
  ctx.node_rank = leaders_below;
  DS_MPI_CHECK(MPI_Bcast(&ctx.node_rank, 1, MPI_INT, 0, ctx.local_comm));
  DS_MPI_CHECK(MPI_Allreduce(&is_leader, &ctx.num_nodes, 1, MPI_INT, MPI_SUM, ctx.mpi_comm));
  ctx.device = choose_device(ctx.local_rank, env);

  if (options.check_environment) {
    // Collective verdict, so that a mismatch on some ranks stops every rank instead of leaving
    // the others blocked in the next collective.
    std::string why;
    try {
      check_against_mpi(ctx.env, ctx.rank, ctx.world_size);
    } catch (const Error& e) {
      why = e.what();
    }
    int ok = why.empty() ? 1 : 0, all_ok = 0;
    DS_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, ctx.mpi_comm));
    if (!ok) throw Error(why);
    if (!all_ok) DS_THROW("init_distributed: the launcher environment disagrees with MPI on another rank");
  }
  if (ctx.thread_level < MPI_THREAD_MULTIPLE)
    DS_WARN("MPI provides thread level " << ctx.thread_level << " < MPI_THREAD_MULTIPLE: shared-memory non-blocking "
            "collectives run inline (no overlap)");

  ctx.runtime = runtime;
  ctx.comm = std::make_shared<MpiComm>(ctx.mpi_comm, MpiCommOptions::from_env(), runtime);
  return ctx;
}

void finalize_distributed(DistributedContext& ctx) {
  ctx.comm.reset();
  ctx.mpi_comm = MPI_COMM_NULL;
  ctx.local_comm = MPI_COMM_NULL;
  ctx.runtime.reset();  // finalizes when no communicator still holds the runtime
}

void abort_job(int code, std::string_view message) {
  std::cerr << message << std::endl;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, code == 0 ? 1 : code);
  std::exit(code == 0 ? 1 : code);
}

}  // namespace ds
