// Engine command lines and the per-rank shim's computations.
#include "ds/launch/command.h"

#include <algorithm>
#include <cctype>

#include "ds/core/error.h"
#include "ds/launch/shell.h"
#include "ds/launch/world_info.h"

namespace ds::launch {
namespace {

bool contains_token(const std::vector<std::string>& v, std::string_view needle) {
  return std::any_of(v.begin(), v.end(), [&](const std::string& s) {
    return s.find(needle) != std::string::npos;
  });
}

// Hosts with at least one slot, with their counts (0-slot hosts run nothing).
std::vector<std::pair<std::string, int>> active_hosts(const WorldInfo& w) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [h, s] : w) {
    DS_CHECK(valid_host_name(h), "invalid host name '" << h << "'");
    if (!s.empty()) out.emplace_back(h, static_cast<int>(s.size()));
  }
  return out;
}

// Hydra's -hosts value (mpich, impi, mvapich): this machine only in local mode.
std::string host_list(const std::vector<std::pair<std::string, int>>& hosts, bool multi_node) {
  if (!multi_node) return "localhost";
  std::string hl;
  for (const auto& [h, n] : hosts) hl += (hl.empty() ? "" : ",") + h;
  return hl;
}

int equal_slots(const std::vector<std::pair<std::string, int>>& hosts, const char* who) {
  int ppn = hosts.front().second;
  for (const auto& [h, n] : hosts) {
    DS_CHECK(n == ppn, who << " requires the same number of slots on every host ('"
                           << hosts.front().first << "' has " << ppn << ", '" << h << "' has "
                           << n << ")");
  }
  return ppn;
}

bool parse_int_env(const EnvList& env, std::string_view key, int& out) {
  const std::string* v = env_get(env, key);
  if (v == nullptr || v->empty()) return false;
  std::size_t used = 0;
  long x = 0;
  try {
    x = std::stol(*v, &used);
  } catch (const std::exception&) {
    DS_THROW(key << "='" << *v << "' is not an integer");
  }
  DS_CHECK(used == v->size() && x >= 0 && x < (1L << 30), key << "='" << *v << "' is not a valid count");
  out = static_cast<int>(x);
  return true;
}

}  // namespace

Launcher parse_launcher(const std::string& name) {
  std::string l = name;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  if (l == "openmpi") return Launcher::OpenMPI;
  if (l == "mpich") return Launcher::MPICH;
  if (l == "impi") return Launcher::IMPI;
  if (l == "mvapich") return Launcher::MVAPICH;
  if (l == "slurm") return Launcher::Slurm;
  DS_CHECK(l != "pdsh", "--launcher pdsh is not supported: dsrun starts every rank through one "
                        "MPI or Slurm launcher (openmpi, mpich, impi, mvapich or slurm; default "
                        "openmpi), which reaches other hosts over ssh itself");
  DS_THROW("unknown --launcher '" << name << "' (openmpi, mpich, impi, mvapich or slurm)");
}

const char* launcher_name(Launcher l) {
  switch (l) {
    case Launcher::OpenMPI: return "openmpi";
    case Launcher::MPICH: return "mpich";
    case Launcher::IMPI: return "impi";
    case Launcher::MVAPICH: return "mvapich";
    case Launcher::Slurm: return "slurm";
  }
  return "?";
}

EnvList collect_exports(const EnvList& environ, const EnvList& from_files, const std::string& cwd,
                        bool multi_node) {
  EnvList out = default_exports(environ);
  if (multi_node) {
    const std::string* pp = env_get(environ, "PYTHONPATH");
    env_set(out, "PYTHONPATH", (pp != nullptr && !pp->empty()) ? cwd + ":" + *pp : cwd);
  }
  if (const std::string* py = env_get(environ, "DS_PYTHON")) env_set(out, "DS_PYTHON", *py);
  for (const auto& [k, v] : from_files) env_set(out, k, v);
  return out;
}

Command build_command(const Resolution& res, const CommandOptions& opts, const EnvList& exports,
                      const EnvList& environ) {
  DS_CHECK(!opts.program.empty(), "no PROGRAM given");
  DS_CHECK(!opts.shim.empty(), "internal: shim path missing");
  if (!opts.no_local_rank) {
    // A second --local_rank reaches the program after (or before) ours and argparse keeps the
    // last one: every rank would silently get the same local rank.
    for (std::size_t i = 0; i < opts.program_args.size(); ++i) {
      const std::string& x = opts.program_args[i];
      DS_CHECK(x != "--local_rank" && !x.starts_with("--local_rank="),
               "the program's arguments contain " << x << " (argument " << i + 1
                   << " after the program); dsrun adds --local_rank=N to each rank itself "
                      "(remove it, or pass --no_local_rank to dsrun, which then adds none and "
                      "passes yours unchanged)");
    }
  }
  auto hosts = active_hosts(res.world);
  DS_CHECK(!hosts.empty(), "no host has slots");
  const int total = world_size(res.world);
  std::vector<std::string> extra = shell_split(opts.launcher_args);
  DS_CHECK(opts.ssh_port == 0 || opts.launcher == Launcher::OpenMPI,
           "--ssh_port works with --launcher openmpi only (" << launcher_name(opts.launcher)
               << (opts.launcher == Launcher::Slurm ? ": srun starts ranks without ssh"
                                                   : ": set the port for those hosts in ~/.ssh/config")
               << ")");

  std::vector<std::string> shim = {opts.shim, "--rank_shim",
                                   "--world_info=" + base64_urlsafe_encode(world_info_json(res.world)),
                                   "--master_addr=" + res.master_addr,
                                   "--master_port=" + std::to_string(res.master_port)};
  if (opts.no_local_rank) shim.push_back("--no_local_rank");
  DS_CHECK(!(opts.module && opts.no_python),
           "--module and --no_python cannot be used together (--module runs `python -u -m "
           "MODULE`, --no_python runs PROGRAM itself)");
  if (opts.module) shim.push_back("--module");
  if (opts.no_python) shim.push_back("--no_python");
  if (!opts.rank_log_prefix.empty()) shim.push_back("--rank_log=" + opts.rank_log_prefix);
  if (opts.bind_cores) shim.push_back("--bind_cores=" + opts.core_list);
  shim.push_back("--");
  shim.push_back(opts.program);
  shim.insert(shim.end(), opts.program_args.begin(), opts.program_args.end());

  Command cmd;
  cmd.exports = exports;
  std::vector<std::string>& a = cmd.argv;
  switch (opts.launcher) {
    case Launcher::OpenMPI: {
      a = {"mpirun"};
      if (opts.as_root) a.push_back("--allow-run-as-root");
      a.insert(a.end(), {"-np", std::to_string(total), "--host"});
      std::string hl;
      if (!res.multi_node) {
        hl = "localhost:" + std::to_string(total);  // local mode: this machine only
      } else {
        for (const auto& [h, n] : hosts) hl += (hl.empty() ? "" : ",") + h + ":" + std::to_string(n);
      }
      a.push_back(hl);
      a.insert(a.end(), {"--map-by", "slot", "--bind-to", "none"});
      if (res.multi_node) {
        // DeepSpeed's eth0 default, suppressed when the user chose interfaces.
        if (!contains_token(extra, "btl_tcp_if_include") && !contains_token(extra, "btl_tcp_if_exclude") &&
            env_get(environ, "OMPI_MCA_btl_tcp_if_include") == nullptr &&
            env_get(environ, "OMPI_MCA_btl_tcp_if_exclude") == nullptr) {
          a.insert(a.end(), {"--mca", "btl_tcp_if_include", "eth0"});
        }
        // Fail fast on unreachable hosts instead of waiting for TCP's timeout. --ssh_port
        // joins whatever ssh arguments are in force: the user's --launcher_args value, else
        // OMPI_MCA_plm_rsh_args (a command-line --mca replaces it, so it is carried over).
        const std::string port = opts.ssh_port > 0 ? " -p " + std::to_string(opts.ssh_port) : "";
        auto it = std::find(extra.begin(), extra.end(), "plm_rsh_args");
        if (it != extra.end() && it + 1 != extra.end()) {
          *(it + 1) += port;
        } else if (const std::string* e = env_get(environ, "OMPI_MCA_plm_rsh_args")) {
          if (!port.empty()) a.insert(a.end(), {"--mca", "plm_rsh_args", *e + port});
        } else {
          a.insert(a.end(), {"--mca", "plm_rsh_args", "-o BatchMode=yes -o ConnectTimeout=10" + port});
        }
      }
      a.insert(a.end(), extra.begin(), extra.end());
      if (res.multi_node && env_get(exports, "UCX_TLS") == nullptr) {
        a.insert(a.end(), {"-x", "UCX_TLS=tcp"});
      }
      for (const auto& [k, v] : exports) a.insert(a.end(), {"-x", k + "=" + v});
      break;
    }
    case Launcher::MPICH: {
      int ppn = equal_slots(hosts, "--launcher mpich");
      std::string hl;
      if (!res.multi_node) {
        hl = "localhost";
      } else {
        for (const auto& [h, n] : hosts) hl += (hl.empty() ? "" : ",") + h;
      }
      a = {"mpiexec", "-n", std::to_string(total), "-ppn", std::to_string(ppn), "-hosts", hl};
      a.insert(a.end(), extra.begin(), extra.end());
      for (const auto& [k, v] : exports) a.insert(a.end(), {"-genv", k, v});
      break;
    }
    case Launcher::IMPI: {
      // Intel MPI's Hydra: -genv NAME VALUE; its own pinning is off (I_MPI_PIN 0) as in
      // DeepSpeed, so --bind_core_list / --bind_cores_to_rank decide the affinity.
      int ppn = equal_slots(hosts, "--launcher impi");
      a = {"mpirun", "-n", std::to_string(total), "-ppn", std::to_string(ppn), "-hosts",
           host_list(hosts, res.multi_node)};
      a.insert(a.end(), extra.begin(), extra.end());
      for (const auto& [k, v] : exports) a.insert(a.end(), {"-genv", k, v});
      if (env_get(exports, "I_MPI_PIN") == nullptr) a.insert(a.end(), {"-genv", "I_MPI_PIN", "0"});
      break;
    }
    case Launcher::MVAPICH: {
      // MVAPICH2's Hydra mpirun; DeepSpeed's MV2_* defaults unless the user exports their own
      // (MV2_ENABLE_AFFINITY=0 leaves binding to dsrun). -hosts instead of DeepSpeed's fixed
      // /tmp/deepspeed_mvapich_hostfile, which concurrent jobs would overwrite.
      int ppn = equal_slots(hosts, "--launcher mvapich");
      a = {"mpirun", "-n", std::to_string(total), "-ppn", std::to_string(ppn), "-hosts",
           host_list(hosts, res.multi_node)};
      a.insert(a.end(), extra.begin(), extra.end());
      EnvList ex;
      for (const auto& [k, v] : std::initializer_list<std::pair<const char*, const char*>>{
               {"MV2_SMP_USE_CMA", "0"}, {"MV2_DEBUG_SHOW_BACKTRACE", "1"}, {"MV2_USE_CUDA", "1"},
               {"MV2_SUPPORT_DL", "1"}, {"MV2_ENABLE_AFFINITY", "0"},
               {"MV2_INTER_ALLGATHER_TUNING", "5"}, {"MV2_CUDA_USE_NAIVE", "0"}}) {
        if (env_get(exports, k) == nullptr) ex.emplace_back(k, v);
      }
      ex.insert(ex.end(), exports.begin(), exports.end());
      for (const auto& [k, v] : ex) a.insert(a.end(), {"-genv", k, v});
      cmd.exports = ex;
      break;
    }
    case Launcher::Slurm: {
      int ppn = equal_slots(hosts, "--launcher slurm");
      // srun inherits its environment (--export=ALL): exports ride in front through env(1),
      // which keeps values with commas intact (--export=K=V would split them).
      a = {"env"};
      for (const auto& [k, v] : exports) a.push_back(k + "=" + v);
      std::string hl;
      for (const auto& [h, n] : hosts) hl += (hl.empty() ? "" : ",") + h;
      a.insert(a.end(), {"srun", "-n", std::to_string(total), "-N", std::to_string(hosts.size()),
                         "--ntasks-per-node=" + std::to_string(ppn), "--nodelist=" + hl,
                         "--export=ALL"});
      // srun's own task binding would narrow the mask the rank shim shares out.
      if (opts.bind_cores && !contains_token(extra, "cpu-bind") && !contains_token(extra, "cpu_bind")) {
        a.push_back("--cpu-bind=none");
      }
      a.insert(a.end(), extra.begin(), extra.end());
      break;
    }
  }
  a.insert(a.end(), shim.begin(), shim.end());
  return cmd;
}

RankEnv compute_rank_env(const WorldInfo& world, const EnvList& environ) {
  RankEnv r;
  int rank = -1, size = -1, local = -1;
  const char* from = nullptr;
  if (parse_int_env(environ, "OMPI_COMM_WORLD_RANK", rank)) {
    from = "OMPI_COMM_WORLD_RANK";
    parse_int_env(environ, "OMPI_COMM_WORLD_SIZE", size);
    parse_int_env(environ, "OMPI_COMM_WORLD_LOCAL_RANK", local);
  } else if (parse_int_env(environ, "MV2_COMM_WORLD_RANK", rank)) {  // MVAPICH2 (also mpirun_rsh)
    from = "MV2_COMM_WORLD_RANK";
    parse_int_env(environ, "MV2_COMM_WORLD_SIZE", size);
    parse_int_env(environ, "MV2_COMM_WORLD_LOCAL_RANK", local);
  } else if (parse_int_env(environ, "PMI_RANK", rank)) {
    from = "PMI_RANK";
    parse_int_env(environ, "PMI_SIZE", size);
    parse_int_env(environ, "MPI_LOCALRANKID", local);
  } else if (parse_int_env(environ, "PMIX_RANK", rank)) {
    from = "PMIX_RANK";
    int sp = -1;
    if (parse_int_env(environ, "SLURM_PROCID", sp) && sp == rank) {
      parse_int_env(environ, "SLURM_NTASKS", size);
      parse_int_env(environ, "SLURM_LOCALID", local);
    }
  } else if (parse_int_env(environ, "SLURM_PROCID", rank)) {
    from = "SLURM_PROCID";
    parse_int_env(environ, "SLURM_NTASKS", size);
    parse_int_env(environ, "SLURM_LOCALID", local);
  }
  DS_CHECK(from != nullptr,
           "no rank in the environment (OMPI_COMM_WORLD_RANK, MV2_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK, "
           "SLURM_PROCID): "
           "the rank shim must be started by mpirun, mpiexec or srun");
  const int ws = world_size(world);
  DS_CHECK(size < 0 || size == ws, "the launcher started " << size << " ranks but world_info has "
                                                           << ws << " slots");
  RankPlace p = place_rank(world, rank);
  DS_CHECK(local < 0 || local == p.local_rank,
           "rank " << rank << " (" << from << ") was placed as local rank " << local
                   << " but world_info puts it at local rank " << p.local_rank << " of host '"
                   << world[static_cast<std::size_t>(p.node)].first
                   << "': the launcher's mapping differs from host-major order");
  r.rank = rank;
  r.local_rank = p.local_rank;
  r.world_size = ws;
  r.local_size = p.local_size;
  r.cross_rank = p.node;
  r.cross_size = static_cast<int>(world.size());
  const auto& slots = world[static_cast<std::size_t>(p.node)].second;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (i) r.cuda_visible_devices += ',';
    r.cuda_visible_devices += std::to_string(slots[i]);
  }
  return r;
}

std::vector<std::string> program_argv(const std::string& program,
                                      const std::vector<std::string>& args, int local_rank,
                                      bool no_local_rank, const std::string& python,
                                      ProgramMode mode) {
  const std::string flag = "--local_rank=" + std::to_string(local_rank);
  std::vector<std::string> out;
  if (mode == ProgramMode::Module || (mode == ProgramMode::Auto && program.ends_with(".py"))) {
    out = {python, "-u"};
    if (mode == ProgramMode::Module) out.push_back("-m");
    out.push_back(program);
    if (!no_local_rank) out.push_back(flag);
    out.insert(out.end(), args.begin(), args.end());
    return out;
  }
  out = {program};
  std::string base = program.substr(program.find_last_of('/') + 1);
  bool is_python = base.starts_with("python");
  std::size_t insert_at = 0;  // index into args after which the flag goes
  if (is_python) {
    // After the script, "-m module" or "-c command"; interpreter options come first.
    std::size_t i = 0;
    insert_at = args.size();
    while (i < args.size()) {
      const std::string& x = args[i];
      if (x == "-m" || x == "-c") {
        insert_at = std::min(i + 2, args.size());
        break;
      }
      if (x == "-W" || x == "-X") {
        i += 2;
        continue;
      }
      if (x == "-") {
        insert_at = i + 1;
        break;
      }
      if (!x.empty() && x[0] == '-') {
        ++i;
        continue;
      }
      insert_at = i + 1;
      break;
    }
  }
  for (std::size_t i = 0; i < insert_at; ++i) out.push_back(args[i]);
  if (!no_local_rank) out.push_back(flag);
  for (std::size_t i = insert_at; i < args.size(); ++i) out.push_back(args[i]);
  return out;
}

}  // namespace ds::launch
