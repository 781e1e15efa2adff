// The command that starts the ranks (the engine's argv from the back-end table, backend.h,
// then the rank shim) and the per-rank shim that gives each rank DeepSpeed's variables.
#pragma once

#include <string>
#include <vector>

#include "ds/launch/backend.h"
#include "ds/launch/env_file.h"
#include "ds/launch/resolve.h"

namespace ds::launch {

struct CommandOptions {
  Launcher launcher = Launcher::OpenMPI;
  std::string launcher_args;       // shell-split and spliced in after the engine's own flags
  bool no_local_rank = false;
  bool as_root = false;            // add Open MPI's --allow-run-as-root
  std::string shim;                // absolute path of the dsrun executable (runs --rank_shim)
  std::string program;
  std::vector<std::string> program_args;
  bool module = false;             // --module: ranks run `<python> -u -m PROGRAM`
  bool no_python = false;          // --no_python: ranks exec PROGRAM even when it ends in .py
  std::string rank_log_prefix;     // --enable_each_rank_log: ranks write <prefix><RANK>.log
  bool bind_cores = false;         // --bind_cores_to_rank / --bind_core_list
  std::string core_list;           // validated --bind_core_list ("" = the rank's allowed cores)
  int ssh_port = 0;                // --ssh_port (Open MPI's ssh agent); 0 = ssh's default
};

struct Command {
  std::vector<std::string> argv;   // argv[0] is looked up in PATH
  EnvList exports;                 // what the ranks get on top of the engine's environment
};

// The exports ranks receive: default prefixes (for multi-node jobs PYTHONPATH gets the
// working directory in front, as DeepSpeed), DS_PYTHON, then the env-file entries (later wins).
EnvList collect_exports(const EnvList& environ, const EnvList& from_files, const std::string& cwd,
                        bool multi_node);

Command build_command(const Resolution& res, const CommandOptions& opts, const EnvList& exports,
                      const EnvList& environ);

// --- the per-rank shim (dsrun --rank_shim ...) ---
struct RankEnv {
  int rank = 0, local_rank = 0, world_size = 0, local_size = 0, cross_rank = 0, cross_size = 0;
  std::string cuda_visible_devices;
};
// The rank from the engine's variables, tried in rank_sources() order (OMPI_COMM_WORLD_RANK,
// MV2_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, SLURM_PROCID: MPI families beat SLURM_* as inside
// sbatch they coexist), and checks that the engine's size and local rank agree with world_info.
RankEnv compute_rank_env(const WorldInfo& world, const EnvList& environ);

// How a rank starts PROGRAM: Auto runs "x.py" as `<python> -u x.py` and anything else
// directly; Module is DeepSpeed's --module (`<python> -u -m PROGRAM`); NoPython is
// --no_python (PROGRAM itself, even x.py).
enum class ProgramMode { Auto, Module, NoPython };

// The program's argv with --local_rank=N in DeepSpeed's place: right after the script.
// For a python interpreter run directly the flag goes after the script / -m module / -c command.
std::vector<std::string> program_argv(const std::string& program,
                                      const std::vector<std::string>& args, int local_rank,
                                      bool no_local_rank, const std::string& python,
                                      ProgramMode mode = ProgramMode::Auto);

}  // namespace ds::launch
