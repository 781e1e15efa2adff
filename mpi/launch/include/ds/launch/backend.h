// The engines dsrun starts ranks with (--launcher), as one table: per back end its name, the
// builder of the engine's argv, the variables its ranks find their rank in, and the check
// that it is installed. Adding a back end is a Launcher value, one row in backends.cpp and
// its builder in engine_argv.cpp (docs/dev/architecture.md, "Launcher back ends").
#pragma once

#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ds/launch/env_file.h"
#include "ds/launch/resolve.h"

namespace ds::launch {

enum class Launcher { OpenMPI, MPICH, IMPI, MVAPICH, Slurm };

struct CommandOptions;
struct Command;

// Where a rank started by an engine reads its rank, the world size and its local rank.
// `agree` (optional): size and local rank are read only when this variable holds the same
// rank (PMIX_RANK is set by several engines; SLURM_* describe it only under srun).
struct RankVars {
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* agree = nullptr;
};

// The engine must be installed: `tool` in PATH ("launcher 'NAME' not installed (no TOOL in
// PATH)"), then, when set, `family_tool` in PATH or `TOOL --version` printing `version_has`
// to tell this MPI family from another one's tool of the same name; else
// "launcher 'NAME' not installed (WRONG_FAMILY)".
struct ToolCheck {
  const char* tool;
  const char* family_tool = nullptr;
  const char* version_has = nullptr;
  const char* wrong_family = nullptr;
};

// What a builder gets: the resolved job, dsrun's options, the hosts that run ranks (with
// their slot counts), the rank total, the split --launcher_args and dsrun's environment.
struct EngineJob {
  const Resolution& res;
  const CommandOptions& opts;
  const std::vector<std::pair<std::string, int>>& hosts;
  int total;
  const std::vector<std::string>& extra;
  const EnvList& environ;
};

// Fills cmd.argv with the engine's part of the command (the rank shim follows it); may add
// engine defaults to cmd.exports, which holds the exports on entry.
using ArgvBuilder = void (*)(const EngineJob& job, Command& cmd);

struct Backend {
  Launcher id;
  const char* name;                // the --launcher value (matched case-insensitively)
  ArgvBuilder build;
  const RankVars* rank_vars;       // what its ranks get (one of rank_sources())
  ToolCheck check;
  // Ranks on other hosts are started over ssh (dsrun checks ssh first); nullptr for srun.
  bool uses_ssh;
  // Why --ssh_port does not apply; nullptr where the engine takes the port.
  const char* no_ssh_port;
  // A one-host job runs on this machine (false for srun: its node may be another one).
  bool local_job_runs_here;
};

// Every back end, in the order --help and errors list them.
std::span<const Backend> backends();
const Backend& backend(Launcher l);

// The rank variable sets, in the order the rank shim tries them: MPI families before
// Slurm's (inside an sbatch allocation both are set), MVAPICH2's MV2_* before the PMI_*
// that its Hydra sets as well.
std::span<const RankVars> rank_sources();

Launcher parse_launcher(const std::string& name);  // case-insensitive; throws on unknown
const char* launcher_name(Launcher l);
// "openmpi, mpich, impi, mvapich or slurm"
std::string launcher_choices();

// Throws when b's engine is not installed. `in_path(name)`: an executable of that name is in
// PATH; `output(argv)`: what running argv prints (stdout and stderr).
void check_installed(const Backend& b, const std::function<bool(const std::string&)>& in_path,
                     const std::function<std::string(const std::vector<std::string>&)>& output);

}  // namespace ds::launch
