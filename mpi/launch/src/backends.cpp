// The back-end table (backend.h): one row per --launcher value.
#include "ds/launch/backend.h"

#include <algorithm>
#include <cctype>

#include "ds/core/error.h"
#include "engine_argv.h"

namespace ds::launch {
namespace {

// Rank variable sets, in the order the rank shim tries them (see rank_sources()).
constexpr RankVars kRankSources[] = {
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK"},  // also mpirun_rsh
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},                                  // Hydra
    {"PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_PROCID"},               // srun --mpi=pmix
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};
constexpr const RankVars* kOmpiVars = &kRankSources[0];
constexpr const RankVars* kMv2Vars = &kRankSources[1];
constexpr const RankVars* kPmiVars = &kRankSources[2];
constexpr const RankVars* kSlurmVars = &kRankSources[4];

constexpr const char* kNoSshPortHydra = "set the port for those hosts in ~/.ssh/config";

const Backend kBackends[] = {
    {Launcher::OpenMPI, "openmpi", engine_argv::openmpi, kOmpiVars,
     {"mpirun", "ompi_info", nullptr, "mpirun is not Open MPI's"}, true, nullptr, true},
    {Launcher::MPICH, "mpich", engine_argv::mpich, kPmiVars, {"mpichversion"}, true, kNoSshPortHydra, true},
    {Launcher::IMPI, "impi", engine_argv::impi, kPmiVars,
     {"mpirun", nullptr, "Intel", "the mpirun in PATH is not Intel MPI's"}, true, kNoSshPortHydra, true},
    {Launcher::MVAPICH, "mvapich", engine_argv::mvapich, kMv2Vars, {"mpiname"}, true, kNoSshPortHydra, true},
    {Launcher::Slurm, "slurm", engine_argv::slurm, kSlurmVars, {"srun"}, false,
     "srun starts ranks without ssh", false},
};

}  // namespace

std::span<const Backend> backends() { return kBackends; }

std::span<const RankVars> rank_sources() { return kRankSources; }

const Backend& backend(Launcher l) {
  for (const Backend& b : kBackends) {
    if (b.id == l) return b;
  }
  DS_THROW("internal: launcher " << static_cast<int>(l) << " has no row in the back-end table");
}

const char* launcher_name(Launcher l) { return backend(l).name; }

std::string launcher_choices() {
  std::string out;
  const std::size_t n = std::size(kBackends);
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += i + 1 == n ? " or " : ", ";
    out += kBackends[i].name;
  }
  return out;
}

Launcher parse_launcher(const std::string& name) {
  std::string l = name;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const Backend& b : kBackends) {
    if (l == b.name) return b.id;
  }
  DS_CHECK(l != "pdsh", "--launcher pdsh is not supported: dsrun starts every rank through one "
                        "MPI or Slurm launcher (" << launcher_choices() << "; default "
                        << kBackends[0].name << "), which reaches other hosts over ssh itself");
  DS_THROW("unknown --launcher '" << name << "' (" << launcher_choices() << ")");
}

void check_installed(const Backend& b, const std::function<bool(const std::string&)>& in_path,
                     const std::function<std::string(const std::vector<std::string>&)>& output) {
  const ToolCheck& c = b.check;
  DS_CHECK(in_path(c.tool), "launcher '" << b.name << "' not installed (no " << c.tool << " in PATH)");
  if (c.family_tool != nullptr) {
    DS_CHECK(in_path(c.family_tool), "launcher '" << b.name << "' not installed (" << c.wrong_family << ")");
  }
  if (c.version_has != nullptr) {
    DS_CHECK(output({c.tool, "--version"}).find(c.version_has) != std::string::npos,
             "launcher '" << b.name << "' not installed (" << c.wrong_family << ")");
  }
}

}  // namespace ds::launch
