// Rank discovery from the environment alone, before (or without) MPI_Init.
//
// Every launcher our users come from leaves its own variables in each rank's environment
// (../../docs/dev/communication.md has the table). discover_environment() reads them with a fixed
// precedence:
//   explicit (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT all set)
//   > azureml > sagemaker > openmpi > mvapich2 > pmi (Hydra / Intel MPI / Cray PALS)
//   > pmix > slurm > singleton.
// MPI's own variables beat SLURM_*: mpirun inside sbatch leaves SLURM_PROCID=0 in every rank.
// Malformed or inconsistent variables (non-numeric, negative, rank >= size, PMI_RANK !=
// PMIX_RANK, a bad Slurm node list) throw ds::Error naming the variables.
//
// After MPI_Init, MPI_Comm_rank / MPI_Comm_size are the truth; check_against_mpi() turns a
// disagreement into an error naming both sources.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace ds {

using EnvMap = std::map<std::string, std::string, std::less<>>;

enum class LaunchSource { Explicit, AzureML, SageMaker, OpenMPI, MVAPICH2, PMI, PMIx, Slurm, Singleton };

// "explicit", "azureml", "sagemaker", "openmpi", "mvapich2", "pmi", "pmix", "slurm", "singleton"
std::string_view launch_source_name(LaunchSource s);

struct EnvDiscovery {
  std::optional<int> rank, world_size, local_rank, local_size, node_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
  LaunchSource source = LaunchSource::Singleton;
  // The variables the rank and size came from, for error messages ("OMPI_COMM_WORLD_SIZE").
  std::string rank_var, world_size_var;
};

// Discovery from an explicit environment (unit tests pass a map).
EnvDiscovery discover_environment(const EnvMap& env);
// Discovery from this process' environment (environ).
EnvDiscovery discover_environment();
// A snapshot of environ as a map.
EnvMap current_environment();

// The local rank a launcher left in this process' environment, for the engine's
// --local_rank check: the first of LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// SLURM_LOCALID that is set (read with ds::env::external); std::nullopt when none is.
// Throws ds::Error naming the variable when its value is not an integer.
std::optional<int> launcher_local_rank();

// Throws ds::Error when the environment determined a rank or size that differs from MPI's,
// e.g. "OMPI_COMM_WORLD_SIZE=4 but MPI_Comm_size=2".
void check_against_mpi(const EnvDiscovery& d, int mpi_rank, int mpi_size);

// One JSON object: {"rank":..,"world_size":..,"local_rank":..,"local_size":..,"node_rank":..,
// "master_addr":..,"master_port":..,"source":".."}; null where the environment is silent.
std::string discovery_to_json(const EnvDiscovery& d);

}  // namespace ds
