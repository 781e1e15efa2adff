// Rank discovery from launcher environment variables (docs/dev/communication.md).
#include "ds/mpi/discovery.h"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <sstream>
#include <vector>

#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/launch/backend.h"
#include "ds/launch/hostlist.h"

extern char** environ;

namespace ds {

std::string_view launch_source_name(LaunchSource s) {
  switch (s) {
    case LaunchSource::Explicit: return "explicit";
    case LaunchSource::AzureML: return "azureml";
    case LaunchSource::SageMaker: return "sagemaker";
    case LaunchSource::OpenMPI: return "openmpi";
    case LaunchSource::MVAPICH2: return "mvapich2";
    case LaunchSource::PMI: return "pmi";
    case LaunchSource::PMIx: return "pmix";
    case LaunchSource::Slurm: return "slurm";
    case LaunchSource::Singleton: return "singleton";
  }
  return "unknown";
}

namespace {

const std::string* find(const EnvMap& env, std::string_view name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}
bool has(const EnvMap& env, std::string_view name) { return find(env, name) != nullptr; }

// A non-negative decimal integer (surrounding blanks allowed), else ds::Error naming the variable.
int parse_int(std::string_view name, const std::string& value) {
  std::string_view v = value;
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\n')) v.remove_suffix(1);
  long long x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size())
    DS_THROW("environment variable " << name << "='" << value << "' is not an integer");
  if (x < 0) DS_THROW("environment variable " << name << "=" << value << " is negative");
  if (x > INT32_MAX) DS_THROW("environment variable " << name << "=" << value << " is too large");
  return static_cast<int>(x);
}

std::optional<int> opt_int(const EnvMap& env, std::string_view name) {
  if (auto* v = find(env, name)) return parse_int(name, *v);
  return std::nullopt;
}

int req_int(const EnvMap& env, std::string_view name, std::string_view why) {
  auto* v = find(env, name);
  if (!v) DS_THROW("environment variable " << name << " is not set (required for " << why << ")");
  return parse_int(name, *v);
}

// First set variable of a list, with its name.
std::optional<int> first_int(const EnvMap& env, std::initializer_list<std::string_view> names,
                             std::string* which = nullptr) {
  for (auto n : names) {
    if (auto v = opt_int(env, n)) {
      if (which) *which = std::string(n);
      return v;
    }
  }
  return std::nullopt;
}

// Two variables that name the same quantity must agree when both are set.
void agree(const EnvMap& env, std::string_view a, std::string_view b) {
  auto va = opt_int(env, a), vb = opt_int(env, b);
  if (va && vb && *va != *vb)
    DS_THROW("inconsistent launcher environment: " << a << "=" << *va << " but " << b << "=" << *vb
             << " (they must be equal)");
}

std::optional<int> port_of(const EnvMap& env, std::string_view name) {
  auto p = opt_int(env, name);
  if (p && (*p < 1 || *p > 65535)) DS_THROW("environment variable " << name << "=" << *p << " is not a TCP port (1-65535)");
  return p;
}

std::vector<std::string> expand_named(const EnvMap& env, std::string_view name) {
  const std::string* v = find(env, name);
  try {
    return launch::expand_hostlist(*v);
  } catch (const Error& e) {
    DS_THROW("bad Slurm node list in " << name << "='" << *v << "': " << e.what());
  }
}

// First host of the step node list, else the job node list: the conventional master under Slurm.
std::optional<std::string> slurm_master(const EnvMap& env) {
  for (std::string_view n : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
    if (has(env, n)) {
      auto hosts = expand_named(env, n);
      if (hosts.empty()) DS_THROW("Slurm node list " << n << " is empty");
      return hosts.front();
    }
  }
  return std::nullopt;
}

void fill_master_from_env(const EnvMap& env, EnvDiscovery& d) {
  if (auto* a = find(env, "MASTER_ADDR"); a && !a->empty()) d.master_addr = *a;
  if (!d.master_port) d.master_port = port_of(env, "MASTER_PORT");
}

// MASTER_ADDR, else (mpirun inside an allocation) the first host of the Slurm node list.
void fill_master_or_slurm(const EnvMap& env, EnvDiscovery& d) {
  fill_master_from_env(env, d);
  if (!d.master_addr) d.master_addr = slurm_master(env);
}

// The rank variables a launcher back end's ranks get: the launcher's table (ds/launch/backend.h)
// is the one list of their names.
const launch::RankVars& vars_of(launch::Launcher l) { return *launch::backend(l).rank_vars; }

// Slurm fields (rank, size, local rank/size, node rank, master) of an srun task.
void fill_slurm(const EnvMap& env, EnvDiscovery& d) {
  const launch::RankVars& v = vars_of(launch::Launcher::Slurm);
  d.rank = req_int(env, v.rank, "Slurm rank discovery");
  d.rank_var = v.rank;
  d.world_size = first_int(env, {"SLURM_STEP_NUM_TASKS", v.size, "SLURM_NPROCS"}, &d.world_size_var);
  d.local_rank = opt_int(env, v.local_rank);
  d.node_rank = opt_int(env, "SLURM_NODEID");
  std::optional<int> nnodes = first_int(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
  for (std::string_view n : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    const std::string* v = find(env, n);
    if (!v) continue;
    std::vector<int> counts;
    try {
      counts = launch::parse_tasks_per_node(*v);
    } catch (const Error& e) {
      DS_THROW("bad task counts in " << n << "='" << *v << "': " << e.what());
    }
    if (d.node_rank) {
      if (*d.node_rank >= static_cast<int>(counts.size()))
        DS_THROW("SLURM_NODEID=" << *d.node_rank << " but " << n << "='" << *v << "' lists only "
                 << counts.size() << " nodes");
      d.local_size = counts[*d.node_rank];
    } else if (counts.size() == 1) {
      d.local_size = counts[0];
      d.node_rank = 0;
    }
    if (nnodes && static_cast<int>(counts.size()) != *nnodes && n == "SLURM_STEP_TASKS_PER_NODE")
      DS_THROW(n << "='" << *v << "' lists " << counts.size() << " nodes but the step has " << *nnodes);
    break;
  }
  if (has(env, "SLURM_STEP_NODELIST") && nnodes && has(env, "SLURM_STEP_NUM_NODES")) {
    auto hosts = expand_named(env, "SLURM_STEP_NODELIST");
    if (static_cast<int>(hosts.size()) != *nnodes)
      DS_THROW("SLURM_STEP_NODELIST='" << *find(env, "SLURM_STEP_NODELIST") << "' names " << hosts.size()
               << " hosts but SLURM_STEP_NUM_NODES=" << *nnodes);
  }
  fill_master_or_slurm(env, d);
}

void fill_ompi(const EnvMap& env, EnvDiscovery& d, std::string_view why) {
  const launch::RankVars& v = vars_of(launch::Launcher::OpenMPI);
  d.rank = req_int(env, v.rank, why);
  d.rank_var = v.rank;
  d.world_size = req_int(env, v.size, why);
  d.world_size_var = v.size;
  d.local_rank = opt_int(env, v.local_rank);
  d.local_size = opt_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
  agree(env, v.rank, "PMIX_RANK");
}

void validate(const EnvDiscovery& d, const EnvMap& env) {
  auto name = [](const std::string& v, std::string_view fallback) { return v.empty() ? std::string(fallback) : v; };
  if (d.world_size && *d.world_size < 1)
    DS_THROW("environment variable " << name(d.world_size_var, "world size") << "=" << *d.world_size << " must be >= 1");
  if (d.rank && d.world_size && *d.rank >= *d.world_size)
    DS_THROW("rank out of range: " << name(d.rank_var, "rank") << "=" << *d.rank << " but "
             << name(d.world_size_var, "world size") << "=" << *d.world_size << " (rank must be < size)");
  if (d.local_size && *d.local_size < 1) DS_THROW("local size from the environment is " << *d.local_size << ", must be >= 1");
  if (d.local_rank && d.local_size && *d.local_rank >= *d.local_size)
    DS_THROW("local rank out of range: local rank " << *d.local_rank << " >= local size " << *d.local_size
             << " (source " << launch_source_name(d.source) << ")");
  if (d.local_size && d.world_size && *d.local_size > *d.world_size)
    DS_THROW("local size " << *d.local_size << " exceeds world size " << *d.world_size << " ("
             << name(d.world_size_var, "world size") << ", source " << launch_source_name(d.source) << ")");
  (void)env;
}

// torchrun, deepspeed launch.py, our dsrun: the five variables are the contract.
bool explicit_set(const EnvMap& env) {
  return has(env, "RANK") && has(env, "WORLD_SIZE") && has(env, "MASTER_ADDR") && has(env, "MASTER_PORT") &&
         has(env, "LOCAL_RANK");
}

// Which launcher started this process, by the first rule that matches (DeepSpeed's order:
// the explicit variables win, AzureML and SageMaker before the plain MPI launchers).
LaunchSource detect_source(const EnvMap& env) {
  if (explicit_set(env)) return LaunchSource::Explicit;
  if (has(env, "AZUREML_EXPERIMENT_ID") && !has(env, "DLTS_JOB_ID")) return LaunchSource::AzureML;
  if (has(env, "SM_TRAINING_ENV")) return LaunchSource::SageMaker;
  if (has(env, vars_of(launch::Launcher::OpenMPI).rank)) return LaunchSource::OpenMPI;
  if (has(env, vars_of(launch::Launcher::MVAPICH).rank)) return LaunchSource::MVAPICH2;
  if (has(env, vars_of(launch::Launcher::MPICH).rank) || has(env, "PALS_RANKID")) return LaunchSource::PMI;
  if (has(env, "PMIX_RANK")) return LaunchSource::PMIx;
  if (has(env, vars_of(launch::Launcher::Slurm).rank)) return LaunchSource::Slurm;
  return LaunchSource::Singleton;
}

void fill_explicit(const EnvMap& env, EnvDiscovery& d) {
  d.rank = req_int(env, "RANK", "explicit");
  d.rank_var = "RANK";
  d.world_size = req_int(env, "WORLD_SIZE", "explicit");
  d.world_size_var = "WORLD_SIZE";
  d.local_rank = req_int(env, "LOCAL_RANK", "explicit");
  d.local_size = first_int(env, {"LOCAL_WORLD_SIZE", "LOCAL_SIZE"});
  d.node_rank = first_int(env, {"GROUP_RANK", "CROSS_RANK", "NODE_RANK"});
  // DeepSpeed's engine check: OMPI_COMM_WORLD_LOCAL_RANK, when present, must equal LOCAL_RANK.
  agree(env, "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK");
  fill_master_from_env(env, d);
}

void fill_azureml(const EnvMap& env, EnvDiscovery& d) {
  fill_ompi(env, d, "AzureML rank discovery");
  d.local_size = req_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "AzureML rank discovery");
  if (*d.local_size != *d.world_size) {
    // Multi-node: the address before ':' (the port inside is deliberately ignored), port
    // MASTER_PORT or 6105.
    const std::string* m = find(env, "AZ_BATCH_MASTER_NODE");
    if (!m) DS_THROW("environment variable AZ_BATCH_MASTER_NODE is not set (required for multi-node AzureML)");
    d.master_addr = m->substr(0, m->find(':'));
    d.master_port = port_of(env, "MASTER_PORT");
    if (!d.master_port) d.master_port = 6105;
  } else {
    const std::string* m = find(env, "AZ_BATCHAI_MPI_MASTER_NODE");
    if (!m) DS_THROW("environment variable AZ_BATCHAI_MPI_MASTER_NODE is not set (required for single-node AzureML)");
    d.master_addr = *m;
    d.master_port = 54965;
    d.node_rank = 0;
  }
}

void fill_sagemaker(const EnvMap& env, EnvDiscovery& d) {
  fill_ompi(env, d, "SageMaker rank discovery");
  if (!has(env, "MASTER_ADDR") || !has(env, "MASTER_PORT"))
    DS_THROW("SageMaker (SM_TRAINING_ENV set) needs MASTER_ADDR and MASTER_PORT in the environment");
  fill_master_from_env(env, d);
}

void fill_mvapich2(const EnvMap& env, EnvDiscovery& d) {
  const launch::RankVars& mv2 = vars_of(launch::Launcher::MVAPICH);
  d.rank = req_int(env, mv2.rank, "MVAPICH2 rank discovery");
  d.rank_var = mv2.rank;
  d.world_size = req_int(env, mv2.size, "MVAPICH2 rank discovery");
  d.world_size_var = mv2.size;
  d.local_rank = opt_int(env, mv2.local_rank);
  d.local_size = opt_int(env, "MV2_COMM_WORLD_LOCAL_SIZE");
  fill_master_or_slurm(env, d);
}

// MPICH Hydra, Intel MPI, Cray PALS. DeepSpeed's helper: PMIX_RANK and PMI_RANK must agree.
void fill_pmi(const EnvMap& env, EnvDiscovery& d) {
  const launch::RankVars& pmi = vars_of(launch::Launcher::MPICH);
  agree(env, pmi.rank, "PMIX_RANK");
  agree(env, pmi.rank, "PALS_RANKID");
  agree(env, pmi.local_rank, "PALS_LOCAL_RANKID");
  d.rank = first_int(env, {pmi.rank, "PALS_RANKID"}, &d.rank_var);
  d.world_size = first_int(env, {pmi.size, "WORLD_SIZE"}, &d.world_size_var);
  d.local_rank = first_int(env, {pmi.local_rank, "PALS_LOCAL_RANKID"});
  d.local_size = first_int(env, {"MPI_LOCALNRANKS", "LOCAL_SIZE"});
  d.node_rank = opt_int(env, "PALS_NODEID");
  fill_master_or_slurm(env, d);
}

void fill_pmix(const EnvMap& env, EnvDiscovery& d) {
  const int r = req_int(env, "PMIX_RANK", "PMIx rank discovery");
  if (auto sp = opt_int(env, "SLURM_PROCID"); sp && *sp == r) {
    fill_slurm(env, d);  // srun --mpi=pmix: the Slurm fields describe this task
  } else {
    fill_master_from_env(env, d);
  }
  d.rank = r;
  d.rank_var = "PMIX_RANK";
}

// No launcher: one process.
void fill_singleton(const EnvMap& env, EnvDiscovery& d) {
  d.rank = 0;
  d.world_size = 1;
  d.local_rank = 0;
  d.local_size = 1;
  d.node_rank = 0;
  fill_master_from_env(env, d);
}

void fill_from(LaunchSource source, const EnvMap& env, EnvDiscovery& d) {
  switch (source) {
    case LaunchSource::Explicit: return fill_explicit(env, d);
    case LaunchSource::AzureML: return fill_azureml(env, d);
    case LaunchSource::SageMaker: return fill_sagemaker(env, d);
    case LaunchSource::OpenMPI:
      fill_ompi(env, d, "Open MPI rank discovery");
      return fill_master_or_slurm(env, d);
    case LaunchSource::MVAPICH2: return fill_mvapich2(env, d);
    case LaunchSource::PMI: return fill_pmi(env, d);
    case LaunchSource::PMIx: return fill_pmix(env, d);
    case LaunchSource::Slurm: return fill_slurm(env, d);
    case LaunchSource::Singleton: return fill_singleton(env, d);
  }
}

}  // namespace

EnvDiscovery discover_environment(const EnvMap& env) {
  EnvDiscovery d;
  d.source = detect_source(env);
  fill_from(d.source, env, d);
  // One node holds everything: the node index is 0.
  if (!d.node_rank && d.local_size && d.world_size && *d.local_size == *d.world_size) d.node_rank = 0;
  validate(d, env);
  return d;
}

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    env.emplace(std::string(static_cast<const char*>(*e), eq), std::string(eq + 1));
  }
  return env;
}

EnvDiscovery discover_environment() { return discover_environment(current_environment()); }

void check_against_mpi(const EnvDiscovery& d, int mpi_rank, int mpi_size) {
  if (d.source == LaunchSource::Singleton) return;  // the environment said nothing
  if (d.world_size && *d.world_size != mpi_size)
    DS_THROW("world size mismatch: " << d.world_size_var << "=" << *d.world_size << " but MPI_Comm_size="
             << mpi_size << " (launcher '" << launch_source_name(d.source)
             << "' and MPI disagree; was the job started with a different launcher or a stale environment?)");
  if (d.rank && *d.rank != mpi_rank)
    DS_THROW("rank mismatch: " << d.rank_var << "=" << *d.rank << " but MPI_Comm_rank=" << mpi_rank
             << " (launcher '" << launch_source_name(d.source) << "' and MPI disagree)");
}

namespace {
void json_string(std::ostringstream& os, const std::string& s) {
  os << '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') os << '\\' << c;
    else if (c < 0x20) { char buf[8]; std::snprintf(buf, sizeof buf, "\\u%04x", c); os << buf; }
    else os << c;
  }
  os << '"';
}
void json_int(std::ostringstream& os, const std::optional<int>& v) {
  if (v) os << *v; else os << "null";
}
}  // namespace

std::string discovery_to_json(const EnvDiscovery& d) {
  std::ostringstream os;
  os << "{\"rank\":"; json_int(os, d.rank);
  os << ",\"world_size\":"; json_int(os, d.world_size);
  os << ",\"local_rank\":"; json_int(os, d.local_rank);
  os << ",\"local_size\":"; json_int(os, d.local_size);
  os << ",\"node_rank\":"; json_int(os, d.node_rank);
  os << ",\"master_addr\":";
  if (d.master_addr) json_string(os, *d.master_addr); else os << "null";
  os << ",\"master_port\":"; json_int(os, d.master_port);
  os << ",\"source\":\"" << launch_source_name(d.source) << "\"}";
  return os.str();
}

std::optional<int> launcher_local_rank() {
  for (const char* name : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const std::optional<std::string> v = env::external(name);
    if (!v) continue;
    try {
      std::size_t pos = 0;
      const int x = std::stoi(*v, &pos);
      if (pos == v->size()) return x;
    } catch (const std::exception&) {
    }
    DS_THROW(name << " expects an integer, got '" << *v << "'");
  }
  return std::nullopt;
}

}  // namespace ds
