// dsrun: DeepSpeed's `deepspeed` launcher front end over real MPI/Slurm engines.
//   dsrun [options] PROGRAM [ARGS...]
// Resolves hostfile + filters into world_info exactly as DeepSpeed (docs/LAUNCHER.md), then
// runs mpirun / mpiexec / srun, which start `dsrun --rank_shim ... -- PROGRAM ARGS` per rank;
// the shim sets RANK, LOCAL_RANK, ... and execs PROGRAM.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cli_usage.h"
#include "ds/core/error.h"
#include "ds/launch/command.h"
#include "ds/launch/env_file.h"
#include "ds/launch/exec_limits.h"
#include "ds/launch/resolve.h"
#include "ds/launch/shell.h"
#include "ds/launch/world_info.h"
#include "run.h"

extern char** environ;

namespace {

using namespace ds::launch;

EnvList current_environ() {
  EnvList out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    out.emplace_back(std::string(*e, static_cast<std::size_t>(eq - *e)), std::string(eq + 1));
  }
  return out;
}

std::string self_path() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  DS_CHECK(n > 0, "cannot find the dsrun executable (/proc/self/exe)");
  return std::string(buf, static_cast<std::size_t>(n));
}

std::string current_dir() {
  char buf[PATH_MAX];
  DS_CHECK(::getcwd(buf, sizeof buf) != nullptr, "cannot read the working directory");
  return buf;
}

// dsrun --rank_shim --world_info=B64 --master_addr=A --master_port=P [--no_local_rank] -- PROG ARGS
int rank_shim(int argc, char** argv) {
  std::string world_b64, addr, port;
  bool no_local_rank = false;
  int i = 2;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.starts_with("--world_info=")) world_b64 = a.substr(13);
    else if (a.starts_with("--master_addr=")) addr = a.substr(14);
    else if (a.starts_with("--master_port=")) port = a.substr(14);
    else if (a == "--no_local_rank") no_local_rank = true;
    else DS_THROW("rank shim: unknown argument '" << a << "'");
  }
  DS_CHECK(i < argc, "rank shim: no program after '--'");
  DS_CHECK(!world_b64.empty(), "rank shim: --world_info missing");
  WorldInfo world = parse_world_info_json(base64_urlsafe_decode(world_b64));
  RankEnv r = compute_rank_env(world, current_environ());
  auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
  set("RANK", std::to_string(r.rank));
  set("LOCAL_RANK", std::to_string(r.local_rank));
  set("WORLD_SIZE", std::to_string(r.world_size));
  set("LOCAL_SIZE", std::to_string(r.local_size));
  set("CROSS_RANK", std::to_string(r.cross_rank));
  set("CROSS_SIZE", std::to_string(r.cross_size));
  set("MASTER_ADDR", addr);
  set("MASTER_PORT", port);
  set("CUDA_VISIBLE_DEVICES", r.cuda_visible_devices);
  std::vector<std::string> args(argv + i + 1, argv + argc);
  const char* py = std::getenv("DS_PYTHON");
  std::vector<std::string> av =
      program_argv(argv[i], args, r.local_rank, no_local_rank, py && *py ? py : "python3");
  std::vector<char*> cav;
  for (auto& s : av) cav.push_back(s.data());
  cav.push_back(nullptr);
  std::fflush(stdout);
  ::execvp(cav[0], cav.data());
  std::fprintf(stderr, "dsrun: error: rank %d: cannot execute '%s': %s\n", r.rank, cav[0],
               std::strerror(errno));
  return 127;
}

void ssh_check(const std::string& host, const EnvList& env) {
  if (const std::string* agent = env_get(env, "OMPI_MCA_plm_rsh_agent")) {
    if (!agent->empty() && agent->find("ssh") == std::string::npos) return;  // custom agent
  }
  std::string out;
  int rc = dsrun::run_capture({"ssh", "-o", "PasswordAuthentication=no", "-o", "BatchMode=yes",
                               "-o", "ConnectTimeout=10", host, "hostname"},
                              out);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  DS_CHECK(rc == 0, "host '" << host << "' is unreachable with passwordless ssh (" << out
                             << "); fix ssh, pass --no_ssh_check, or remove the hostfile to run on "
                                "this machine only");
}

int launch(int argc, char** argv) {
  CLI::App app{"dsrun: DeepSpeed-style launcher over mpirun / mpiexec / srun.\n"
               "Usage: dsrun [options] PROGRAM [ARGS...]   (everything after PROGRAM goes to it)",
               "dsrun"};
  app.prefix_command();
  ResolveOptions ro;
  std::string launcher = "openmpi", launcher_args;
  bool no_local_rank = false, no_ssh_check = false, dry_run = false;
  CLI::Option* hostfile_opt =
      app.add_option("-H,--hostfile", ro.hostfile, "hostfile (DeepSpeed / Open MPI / Horovod forms)")
          ->capture_default_str();
  app.add_option("-i,--include", ro.include, "resources to use: NODE[:SLOT,...][@NODE...]");
  app.add_option("-e,--exclude", ro.exclude, "resources to leave out, same grammar as --include");
  app.add_option("--num_nodes", ro.num_nodes, "use the first N hosts (0 = all)");
  app.add_option("--num_gpus,--num_accelerators", ro.num_gpus, "slots 0..G-1 on every host (0 = all)");
  app.add_option("--master_addr", ro.master_addr, "rank 0's address (default: first host)");
  app.add_option("--master_port", ro.master_port, "rank 0's port")->capture_default_str();
  app.add_option("--launcher", launcher, "openmpi, mpich or slurm")->capture_default_str();
  app.add_option("--launcher_args", launcher_args, "extra engine arguments (shell-split)");
  app.add_flag("--force_multi", ro.force_multi, "multi-node mode even for one host");
  app.add_flag("--no_local_rank", no_local_rank, "do not pass --local_rank=N to PROGRAM");
  app.add_flag("--no_ssh_check", no_ssh_check, "skip the ssh reachability check");
  app.add_flag("--dry_run", dry_run, "print world_info JSON and the command, run nothing");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ds::tools::usage_exit(app, e, "dsrun");  // --help: 0; a parse error: 2, like other bad input
  }
  ro.hostfile_given = hostfile_opt->count() > 0;  // a named hostfile must exist
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest.front() == "--") rest.erase(rest.begin());  // "dsrun [opts] -- PROGRAM"
  DS_CHECK(!rest.empty(), "no PROGRAM given (dsrun [options] PROGRAM [ARGS...])");
  DS_CHECK(rest.front().empty() || rest.front()[0] != '-',
           "unknown option '" << rest.front() << "' (see dsrun --help; use '--' before a PROGRAM "
                                                 "whose name starts with '-')");

  CommandOptions co;
  co.launcher = parse_launcher(launcher);
  co.launcher_args = launcher_args;
  co.no_local_rank = no_local_rank;
  co.as_root = ::geteuid() == 0;
  co.shim = self_path();
  co.program = rest.front();
  co.program_args.assign(rest.begin() + 1, rest.end());

  EnvList env = current_environ();
  Resolution res = resolve(ro, env, [&] { return count_local_devices(env); });
  for (const auto& n : res.notes) std::fprintf(stderr, "dsrun: %s\n", n.c_str());
  if (res.unset_cuda_visible) {
    ::unsetenv("CUDA_VISIBLE_DEVICES");
    std::erase_if(env, [](const auto& kv) { return kv.first == "CUDA_VISIBLE_DEVICES"; });
  }
  std::string cwd = current_dir();
  EnvList from_files = read_env_files(env_file_paths(env, cwd));
  EnvList exports = collect_exports(env, from_files, cwd, res.multi_node);
  Command cmd = build_command(res, co, exports, env);
  // Before anything starts (and in --dry_run): a variable too big for exec is named here.
  check_exec_size(cmd, env, system_exec_limits());

  if (dry_run) {
    std::string hosts = "[";
    for (std::size_t k = 0; k < res.world.size(); ++k) {
      if (k) hosts += ", ";
      hosts += json_quote(res.world[k].first);
    }
    hosts += "]";
    std::printf("{\"world_info\": %s, \"host_order\": %s, \"world_size\": %d, \"master_addr\": %s, "
                "\"master_port\": %d}\n",
                world_info_json(res.world).c_str(), hosts.c_str(), world_size(res.world),
                json_quote(res.master_addr).c_str(), res.master_port);
    std::printf("%s\n", shell_join(cmd.argv).c_str());
    return 0;
  }

  const char* tool = co.launcher == Launcher::OpenMPI ? "mpirun"
                     : co.launcher == Launcher::MPICH ? "mpichversion"
                                                      : "srun";
  DS_CHECK(dsrun::in_path(tool), "launcher '" << launcher_name(co.launcher) << "' not installed (no "
                                               << tool << " in PATH)");
  if (co.launcher == Launcher::OpenMPI) {
    DS_CHECK(dsrun::in_path("ompi_info"), "launcher 'openmpi' not installed (mpirun is not Open MPI's)");
  }
  if (res.multi_node && res.source == PoolSource::Hostfile && !no_ssh_check &&
      co.launcher != Launcher::Slurm) {
    ssh_check(res.world.front().first, env);
  }
  return dsrun::run_supervised(cmd.argv, 10);
}

}  // namespace

int main(int argc, char** argv) {
  bool shim = argc > 1 && std::strcmp(argv[1], "--rank_shim") == 0;
  try {
    return shim ? rank_shim(argc, argv) : launch(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsrun: error: %s\n", e.what());
    return shim ? 127 : 2;
  }
}
