// init_distributed(): MPI set up the way a training process needs it.
//
// - MPI_Init_thread asking for MPI_THREAD_MULTIPLE; the level provided is recorded (MpiComm
//   runs its shared-memory non-blocking collectives on a progress thread only at MULTIPLE).
// - If MPI is already initialized (an mpi4py program), it is neither initialized nor
//   finalized here: we finalize only what we initialized.
// - Our own MPI_Comm_dup of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so DS_MPI_CHECK reports
//   errors instead of MPI aborting.
// - local rank / size from MPI_Comm_split_type(MPI_COMM_TYPE_SHARED); node rank = index of
//   this node among nodes (ordered by their lowest world rank).
// - The environment's view (discovery.h) is checked against MPI_Comm_rank / MPI_Comm_size.
// - ds::set_process_rank(rank) so errors and logs carry the rank.
//
// Lifetime: the context and every communicator made from it share one runtime token; MPI is
// finalized (when we initialized it) once the last of them is gone, or by
// finalize_distributed(), which is collective.
#pragma once

#include <mpi.h>

#include <memory>
#include <string>
#include <string_view>

#include "ds/mpi/communicator.h"
#include "ds/mpi/discovery.h"

namespace ds {

namespace detail { struct MpiRuntime; }

struct InitOptions {
  bool check_environment = true;  // compare discovered rank/size with MPI's
  const EnvMap* env = nullptr;    // environment to check against (nullptr: environ)
};

struct DistributedContext {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_size = 1;
  int node_rank = 0, num_nodes = 1;
  int device = 0;                        // accelerator index for this rank (see docs/dev/communication.md)
  int thread_level = MPI_THREAD_SINGLE;  // what MPI provided
  bool initialized_mpi = false;          // true when we called MPI_Init_thread
  EnvDiscovery env;                      // what the environment said
  MPI_Comm mpi_comm = MPI_COMM_NULL;     // dup of MPI_COMM_WORLD, MPI_ERRORS_RETURN
  MPI_Comm local_comm = MPI_COMM_NULL;   // ranks sharing memory with this one
  std::shared_ptr<Communicator> comm;    // MpiComm over mpi_comm
  std::shared_ptr<detail::MpiRuntime> runtime;
};

DistributedContext init_distributed(const InitOptions& options = {});

// Collective. Frees the context's communicators and, when the last holder of the runtime is
// gone and we initialized MPI, calls MPI_Finalize. Safe to call twice.
void finalize_distributed(DistributedContext& ctx);

// Device choice: local_rank, or local_rank modulo the number of entries in
// CUDA_VISIBLE_DEVICES when that is set (a launcher's slot list).
int choose_device(int local_rank, const EnvMap& env);

// Prints `message` as one line on stderr and ends the whole job: MPI_Abort(MPI_COMM_WORLD)
// when MPI is up (so no rank hangs), std::exit otherwise.
[[noreturn]] void abort_job(int code, std::string_view message);

namespace detail {
// Keeps MPI alive while a context or communicator uses it; finalizes what we initialized.
struct MpiRuntime {
  bool we_initialized = false;
  MPI_Comm world_dup = MPI_COMM_NULL;
  MPI_Comm local = MPI_COMM_NULL;
  ~MpiRuntime();
};
}  // namespace detail

}  // namespace ds
