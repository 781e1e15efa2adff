// DeepSpeed's command-line flags for apps (deepspeed.add_config_arguments):
//   --deepspeed               (a flag for user code: "use the engine")
//   --deepspeed_config FILE   the ds_config.json
//   --local_rank N            set by launchers; must agree with the environment when given
// plus DeepSpeed's deprecated --deepscale / --deepscale_config aliases.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace CLI { class App; }

namespace ds::engine {

struct DeepSpeedArgs {
  bool deepspeed = false;
  std::string deepspeed_config;  // empty: not given
  int local_rank = -1;           // -1: not given
};

// Adds the flags to a CLI11 app; values land in `out` when the app parses.
void add_deepspeed_args(CLI::App& app, DeepSpeedArgs& out);

// Plain argv scan for apps without CLI11: recognises the flags above (also "--flag=value"),
// removes them from `rest` order-preserving, and returns them. Errors (missing value, bad
// integer) throw ds::Error naming the flag.
DeepSpeedArgs parse_deepspeed_args(int argc, const char* const* argv, std::vector<std::string>* rest = nullptr);

// The local rank from --local_rank or the environment (ds::launcher_local_rank(),
// ds/mpi/discovery.h: LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID);
// throws when --local_rank disagrees with the environment (DeepSpeed asserts the same).
int resolve_local_rank(const DeepSpeedArgs& args);

}  // namespace ds::engine
