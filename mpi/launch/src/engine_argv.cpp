// Each engine's command line up to the rank shim: Open MPI's mpirun, the Hydra family
// (MPICH mpiexec, Intel MPI and MVAPICH2 mpirun) and Slurm's srun.
#include "engine_argv.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "ds/core/error.h"
#include "ds/launch/command.h"

namespace ds::launch::engine_argv {
namespace {

using Hosts = std::vector<std::pair<std::string, int>>;

bool contains_token(const std::vector<std::string>& v, std::string_view needle) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) {
    return s.find(needle) != std::string::npos;
  });
}

// Hydra's -hosts value (mpich, impi, mvapich): this machine only in local mode.
std::string host_list(const Hosts& hosts, bool multi_node) {
  if (!multi_node) return "localhost";
  std::string hl;
  for (const auto& [h, n] : hosts) hl += (hl.empty() ? "" : ",") + h;
  return hl;
}

int equal_slots(const EngineJob& job) {
  const Hosts& hosts = job.hosts;
  int ppn = hosts.front().second;
  for (const auto& [h, n] : hosts) {
    DS_CHECK(n == ppn, "--launcher " << launcher_name(job.opts.launcher)
                           << " requires the same number of slots on every host ('"
                           << hosts.front().first << "' has " << ppn << ", '" << h << "' has "
                           << n << ")");
  }
  return ppn;
}

// `exe` -n N -ppn P -hosts H [launcher_args] -genv K V ... (the three Hydra launchers).
std::vector<std::string> hydra(const EngineJob& job, const char* exe, const EnvList& exports) {
  int ppn = equal_slots(job);
  std::vector<std::string> a = {exe, "-n", std::to_string(job.total), "-ppn", std::to_string(ppn), "-hosts",
                                host_list(job.hosts, job.res.multi_node)};
  a.insert(a.end(), job.extra.begin(), job.extra.end());
  for (const auto& [k, v] : exports) a.insert(a.end(), {"-genv", k, v});
  return a;
}

}  // namespace

void openmpi(const EngineJob& job, Command& cmd) {
  const Resolution& res = job.res;
  std::vector<std::string> extra = job.extra;
  std::vector<std::string>& a = cmd.argv;
  a = {"mpirun"};
  if (job.opts.as_root) a.push_back("--allow-run-as-root");
  a.insert(a.end(), {"-np", std::to_string(job.total), "--host"});
  std::string hl;
  if (!res.multi_node) {
    hl = "localhost:" + std::to_string(job.total);  // local mode: this machine only
  } else {
    for (const auto& [h, n] : job.hosts) hl += (hl.empty() ? "" : ",") + h + ":" + std::to_string(n);
  }
  a.push_back(hl);
  a.insert(a.end(), {"--map-by", "slot", "--bind-to", "none"});
  if (res.multi_node) {
    // DeepSpeed's eth0 default, suppressed when the user chose interfaces.
    if (!contains_token(extra, "btl_tcp_if_include") && !contains_token(extra, "btl_tcp_if_exclude") &&
        env_get(job.environ, "OMPI_MCA_btl_tcp_if_include") == nullptr &&
        env_get(job.environ, "OMPI_MCA_btl_tcp_if_exclude") == nullptr) {
      a.insert(a.end(), {"--mca", "btl_tcp_if_include", "eth0"});
    }
    // Fail fast on unreachable hosts instead of waiting for TCP's timeout. --ssh_port
    // joins whatever ssh arguments are in force: the user's --launcher_args value, else
    // OMPI_MCA_plm_rsh_args (a command-line --mca replaces it, so it is carried over).
    const std::string port = job.opts.ssh_port > 0 ? " -p " + std::to_string(job.opts.ssh_port) : "";
    auto it = std::find(extra.begin(), extra.end(), "plm_rsh_args");
    if (it != extra.end() && it + 1 != extra.end()) {
      *(it + 1) += port;
    } else if (const std::string* e = env_get(job.environ, "OMPI_MCA_plm_rsh_args")) {
      if (!port.empty()) a.insert(a.end(), {"--mca", "plm_rsh_args", *e + port});
    } else {
      a.insert(a.end(), {"--mca", "plm_rsh_args", "-o BatchMode=yes -o ConnectTimeout=10" + port});
    }
  }
  a.insert(a.end(), extra.begin(), extra.end());
  if (res.multi_node && env_get(cmd.exports, "UCX_TLS") == nullptr) {
    a.insert(a.end(), {"-x", "UCX_TLS=tcp"});
  }
  for (const auto& [k, v] : cmd.exports) a.insert(a.end(), {"-x", k + "=" + v});
}

void mpich(const EngineJob& job, Command& cmd) { cmd.argv = hydra(job, "mpiexec", cmd.exports); }

void impi(const EngineJob& job, Command& cmd) {
  // Intel MPI's Hydra: -genv NAME VALUE; its own pinning is off (I_MPI_PIN 0) as in
  // DeepSpeed, so --bind_core_list / --bind_cores_to_rank decide the affinity.
  cmd.argv = hydra(job, "mpirun", cmd.exports);
  if (env_get(cmd.exports, "I_MPI_PIN") == nullptr) cmd.argv.insert(cmd.argv.end(), {"-genv", "I_MPI_PIN", "0"});
}

void mvapich(const EngineJob& job, Command& cmd) {
  // MVAPICH2's Hydra mpirun; DeepSpeed's MV2_* defaults unless the user exports their own
  // (MV2_ENABLE_AFFINITY=0 leaves binding to dsrun). -hosts instead of DeepSpeed's fixed
  // /tmp/deepspeed_mvapich_hostfile, which concurrent jobs would overwrite.
  EnvList ex;
  for (const auto& [k, v] : std::initializer_list<std::pair<const char*, const char*>>{
           {"MV2_SMP_USE_CMA", "0"}, {"MV2_DEBUG_SHOW_BACKTRACE", "1"}, {"MV2_USE_CUDA", "1"},
           {"MV2_SUPPORT_DL", "1"}, {"MV2_ENABLE_AFFINITY", "0"},
           {"MV2_INTER_ALLGATHER_TUNING", "5"}, {"MV2_CUDA_USE_NAIVE", "0"}}) {
    if (env_get(cmd.exports, k) == nullptr) ex.emplace_back(k, v);
  }
  ex.insert(ex.end(), cmd.exports.begin(), cmd.exports.end());
  cmd.argv = hydra(job, "mpirun", ex);
  cmd.exports = ex;
}

void slurm(const EngineJob& job, Command& cmd) {
  int ppn = equal_slots(job);
  // srun inherits its environment (--export=ALL): exports ride in front through env(1),
  // which keeps values with commas intact (--export=K=V would split them).
  std::vector<std::string>& a = cmd.argv;
  a = {"env"};
  for (const auto& [k, v] : cmd.exports) a.push_back(k + "=" + v);
  std::string hl;
  for (const auto& [h, n] : job.hosts) hl += (hl.empty() ? "" : ",") + h;
  a.insert(a.end(), {"srun", "-n", std::to_string(job.total), "-N", std::to_string(job.hosts.size()),
                     "--ntasks-per-node=" + std::to_string(ppn), "--nodelist=" + hl, "--export=ALL"});
  // srun's own task binding would narrow the mask the rank shim shares out.
  if (job.opts.bind_cores && !contains_token(job.extra, "cpu-bind") && !contains_token(job.extra, "cpu_bind")) {
    a.push_back("--cpu-bind=none");
  }
  a.insert(a.end(), job.extra.begin(), job.extra.end());
}

}  // namespace ds::launch::engine_argv
