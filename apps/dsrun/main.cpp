// dsrun: DeepSpeed's `deepspeed` launcher front end over real MPI/Slurm engines.
//   dsrun [options] PROGRAM [ARGS...]
// Resolves hostfile + filters into world_info exactly as DeepSpeed (docs/user/launching.md), then
// runs mpirun / mpiexec / srun, which start `dsrun --rank_shim ... -- PROGRAM ARGS` per rank;
// the shim sets RANK, LOCAL_RANK, ... and execs PROGRAM.
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <ctime>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cli_usage.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/launch/command.h"
#include "ds/launch/core_list.h"
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

// The cores this process may run on (its affinity mask), ascending.
std::vector<int> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  DS_CHECK(::sched_getaffinity(0, sizeof set, &set) == 0,
           "cannot read the CPU affinity: " << std::strerror(errno));
  std::vector<int> out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

// mkdir -p; an existing non-directory is an error naming the flag.
void make_dirs(const std::string& dir, const char* flag) {
  std::string cur;
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST) {
      DS_THROW(flag << ": cannot create directory '" << cur << "': " << std::strerror(errno));
    }
  }
  struct stat st{};
  DS_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
           flag << ": '" << dir << "' exists and is not a directory");
}

// Per-rank log: this rank's stdout and stderr go to <prefix><RANK>.log (kept across exec).
void redirect_to_log(const std::string& prefix, int rank) {
  make_dirs(prefix.substr(0, prefix.find_last_of('/')), "--enable_each_rank_log");
  std::string path = prefix + std::to_string(rank) + ".log";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  DS_CHECK(fd >= 0, "--enable_each_rank_log: cannot open '" << path << "': " << std::strerror(errno));
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(fd, 1);
  ::dup2(fd, 2);
  ::close(fd);
}

// Binds this rank (and so the program it execs) to its share of `list` ("" = the cores this
// process may use now) and sets OMP_NUM_THREADS to that share's size, as DeepSpeed's launch.py.
void bind_rank(const std::string& list, int local_rank, int local_size, const std::string& host) {
  std::vector<int> cores = list.empty() ? allowed_cores() : parse_core_list(list);
  std::vector<int> mine = cores_for_rank(cores, local_rank, local_size);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : mine) {
    DS_CHECK(c < CPU_SETSIZE, "--bind_core_list: core " << c << " is above " << CPU_SETSIZE - 1);
    CPU_SET(c, &set);
  }
  // The kernel silently drops absent cores as long as one remains: read the mask back.
  bool ok = ::sched_setaffinity(0, sizeof set, &set) == 0;
  std::vector<int> got = ok ? allowed_cores() : std::vector<int>{};
  DS_CHECK(got == mine, "core binding: local rank " << local_rank << " on host '" << host
                            << "' should run on cores " << format_core_list(mine)
                            << " but this host lets it use "
                            << (got.empty() ? std::string("none of them") : "only " + format_core_list(got))
                            << " (check --bind_core_list against the host's CPUs)");
  ::setenv("OMP_NUM_THREADS", std::to_string(mine.size()).c_str(), 1);
}

std::string current_dir() {
  char buf[PATH_MAX];
  DS_CHECK(::getcwd(buf, sizeof buf) != nullptr, "cannot read the working directory");
  return buf;
}

// dsrun --rank_shim --world_info=B64 --master_addr=A --master_port=P [--no_local_rank] -- PROG ARGS
int rank_shim(int argc, char** argv) {
  std::string world_b64, addr, port, rank_log, cores;
  bool no_local_rank = false, bind = false;
  ProgramMode mode = ProgramMode::Auto;
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
    else if (a == "--module") mode = ProgramMode::Module;
    else if (a == "--no_python") mode = ProgramMode::NoPython;
    else if (a.starts_with("--rank_log=")) rank_log = a.substr(11);
    else if (a.starts_with("--bind_cores=")) bind = true, cores = a.substr(13);
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
  if (bind) bind_rank(cores, r.local_rank, r.local_size, world[static_cast<std::size_t>(r.cross_rank)].first);
  if (!rank_log.empty()) redirect_to_log(rank_log, r.rank);
  std::vector<std::string> args(argv + i + 1, argv + argc);
  std::vector<std::string> av =
      program_argv(argv[i], args, r.local_rank, no_local_rank, ds::env::get_string("DS_PYTHON"), mode);
  std::vector<char*> cav;
  for (auto& s : av) cav.push_back(s.data());
  cav.push_back(nullptr);
  std::fflush(stdout);
  ::execvp(cav[0], cav.data());
  std::fprintf(stderr, "dsrun: error: rank %d: cannot execute '%s': %s\n", r.rank, cav[0],
               std::strerror(errno));
  return 127;
}

void ssh_check(const std::string& host, const EnvList& env, int port) {
  if (const std::string* agent = env_get(env, "OMPI_MCA_plm_rsh_agent")) {
    if (!agent->empty() && agent->find("ssh") == std::string::npos) return;  // custom agent
  }
  std::string out;
  std::vector<std::string> argv = {"ssh", "-o", "PasswordAuthentication=no", "-o", "BatchMode=yes",
                                   "-o", "ConnectTimeout=10"};
  if (port > 0) argv.insert(argv.end(), {"-p", std::to_string(port)});
  argv.insert(argv.end(), {host, "hostname"});
  int rc = dsrun::run_capture(argv, out);
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  DS_CHECK(rc == 0, "host '" << host << "' is unreachable with passwordless ssh (" << out
                             << "); fix ssh, pass --no_ssh_check, or remove the hostfile to run on "
                                "this machine only");
}

// dsrun's own flags, as parsed; `rest` is PROGRAM and its arguments.
struct LaunchFlags {
  ResolveOptions ro;
  std::string launcher = "openmpi", launcher_args;
  bool no_local_rank = false, no_ssh_check = false, dry_run = false;
  bool module = false, no_python = false, save_pid = false, bind_cores = false, quiet = false;
  std::string rank_log_dir, core_list, log_level = "info";
  int ssh_port = 0;
  bool core_list_given = false, ssh_port_given = false, log_level_given = false;
  std::vector<std::string> rest;
};

// DeepSpeed flags dsrun cannot honour: accepted by the parser only to be refused with a reason.
std::vector<std::pair<CLI::Option*, const char*>> add_refused_flags(CLI::App& app, std::string& unused,
                                                                    bool& unused_flag) {
  return {
      {app.add_flag("--no_ssh", unused_flag)->group(""),
       "--no_ssh (one launch per node, met through MASTER_ADDR) is not supported: dsrun starts the "
       "ranks of every node from one mpirun/mpiexec/srun (one MPI world); run dsrun once, on one "
       "node"},
      {app.add_option("--node_rank", unused)->group(""),
       "--node_rank (for --no_ssh per-node launches) is not supported: dsrun starts the ranks of "
       "every node from one mpirun/mpiexec/srun and numbers nodes in hostfile order"},
      {app.add_option("--venv_script", unused)->group(""),
       "--venv_script is for DeepSpeed's pdsh launcher: dsrun's ranks inherit dsrun's environment "
       "(mpirun -x / srun --export); activate the environment before running dsrun"},
      {app.add_flag("--elastic_training", unused_flag)->group(""),
       "--elastic_training is not supported (dsrun runs a fixed MPI world)"},
      {app.add_option("--min_elastic_nodes", unused)->group(""),
       "--min_elastic_nodes is not supported (no elastic training in dsrun)"},
      {app.add_option("--max_elastic_nodes", unused)->group(""),
       "--max_elastic_nodes is not supported (no elastic training in dsrun)"},
      {app.add_option("--autotuning", unused)->group(""), "--autotuning is not supported by dsrun"},
  };
}

// Parses argv into `f`. Returns the exit code when dsrun should stop here (--help: 0, a parse
// error: 2, like other bad input); throws ds::Error for a refused flag or a missing PROGRAM.
std::optional<int> parse_launch_flags(int argc, char** argv, LaunchFlags& f) {
  CLI::App app{"dsrun: DeepSpeed-style launcher over mpirun / mpiexec / srun.\n"
               "Usage: dsrun [options] PROGRAM [ARGS...]   (everything after PROGRAM goes to it)",
               "dsrun"};
  app.prefix_command();
  ResolveOptions& ro = f.ro;
  CLI::Option* hostfile_opt =
      app.add_option("-H,--hostfile", ro.hostfile, "hostfile (DeepSpeed / Open MPI / Horovod forms)")
          ->capture_default_str();
  app.add_option("-i,--include", ro.include, "resources to use: NODE[:SLOT,...][@NODE...]");
  app.add_option("-e,--exclude", ro.exclude, "resources to leave out, same grammar as --include");
  app.add_option("--num_nodes", ro.num_nodes, "use the first N hosts (0 = all)");
  app.add_option("--num_gpus,--num_accelerators", ro.num_gpus, "slots 0..G-1 on every host (0 = all)");
  app.add_option("--master_addr", ro.master_addr, "rank 0's address (default: first host)");
  app.add_option("--master_port", ro.master_port, "rank 0's port")->capture_default_str();
  app.add_option("--launcher", f.launcher, launcher_choices())->capture_default_str();
  app.add_option("--launcher_args", f.launcher_args, "extra engine arguments (shell-split)");
  app.add_flag("--force_multi", ro.force_multi, "multi-node mode even for one host");
  app.add_flag("--no_local_rank", f.no_local_rank, "do not pass --local_rank=N to PROGRAM");
  app.add_flag("--no_ssh_check", f.no_ssh_check, "skip the ssh reachability check");
  app.add_flag("--dry_run", f.dry_run, "print world_info JSON and the command, run nothing");
  app.add_flag("--module", f.module, "ranks run `python -u -m PROGRAM` (PROGRAM is a module name)");
  app.add_flag("--no_python", f.no_python, "ranks run PROGRAM itself, even when it ends in .py");
  app.add_flag("--save_pid", f.save_pid, "write dsrun's pid to /tmp/<pid>.deepspeed while it runs");
  app.add_option("--enable_each_rank_log", f.rank_log_dir,
                 "DIR: each rank's stdout+stderr go to DIR/<YYYYmmddHHMMSS>_rank<RANK>.log");
  app.add_flag("--bind_cores_to_rank", f.bind_cores, "bind each local rank to its share of the cores");
  CLI::Option* core_opt = app.add_option(
      "--bind_core_list", f.core_list, "cores to share out, e.g. 0,2-4,6 (implies --bind_cores_to_rank)");
  CLI::Option* ssh_port_opt =
      app.add_option("--ssh_port", f.ssh_port, "ssh port for Open MPI's remote start and the ssh check");
  CLI::Option* level_opt =
      app.add_option("--log_level", f.log_level, "dsrun's messages: debug, info, warning, error, critical")
          ->capture_default_str();
  app.add_flag("-q,--quiet", f.quiet, "only errors from dsrun (--log_level error)");
  std::string unused;
  bool unused_flag = false;
  const auto refused = add_refused_flags(app, unused, unused_flag);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ds::tools::usage_exit(app, e, "dsrun");
  }
  for (const auto& [opt, why] : refused) DS_CHECK(opt->count() == 0, why);
  ro.hostfile_given = hostfile_opt->count() > 0;  // a named hostfile must exist
  f.core_list_given = core_opt->count() > 0;
  f.ssh_port_given = ssh_port_opt->count() > 0;
  f.log_level_given = level_opt->count() > 0;
  f.rest = app.remaining();
  if (!f.rest.empty() && f.rest.front() == "--") f.rest.erase(f.rest.begin());  // "dsrun [opts] -- PROGRAM"
  DS_CHECK(!f.rest.empty(), "no PROGRAM given (dsrun [options] PROGRAM [ARGS...])");
  DS_CHECK(f.rest.front().empty() || f.rest.front()[0] != '-',
           "unknown option '" << f.rest.front() << "' (see dsrun --help; use '--' before a PROGRAM "
                                                   "whose name starts with '-')");
  return std::nullopt;
}

// dsrun's messages at or above the chosen level go to stderr.
struct Say {
  int level = 1;  // 0 debug, 1 info, 2 warning, 3 error, 4 critical
  void operator()(int at, const std::string& text) const {
    if (level <= at) std::fprintf(stderr, "dsrun: %s\n", text.c_str());
  }
};

// The flags that constrain each other; returns the message level.
Say check_launch_flags(LaunchFlags& f) {
  std::string& log_level = f.log_level;
  const std::string given = log_level;
  std::transform(log_level.begin(), log_level.end(), log_level.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  const std::vector<std::string> levels = {"debug", "info", "warning", "error", "critical"};
  auto level_it = std::find(levels.begin(), levels.end(), log_level);
  DS_CHECK(level_it != levels.end(),
           "--log_level '" << given << "' is not one of debug, info, warning, error, critical");
  DS_CHECK(!(f.quiet && f.log_level_given && log_level != "error"),
           "-q/--quiet means --log_level error; it contradicts --log_level " << log_level);
  DS_CHECK(!(f.module && f.no_python),
           "--module and --no_python cannot be used together (--module runs `python -u -m "
           "MODULE`, --no_python runs PROGRAM itself)");
  DS_CHECK(!f.ssh_port_given || (f.ssh_port > 0 && f.ssh_port < 65536),
           "--ssh_port " << f.ssh_port << " is not a port (1-65535)");
  return Say{f.quiet ? 3 : static_cast<int>(level_it - levels.begin())};
}

// --enable_each_rank_log DIR: "DIR/<YYYYmmddHHMMSS>_rank" (absolute), or "" when off.
std::string rank_log_prefix(const std::string& rank_log_dir) {
  if (rank_log_dir.empty() || rank_log_dir == "None") return {};  // DeepSpeed's default is the string "None"
  std::string dir = rank_log_dir.front() == '/' ? rank_log_dir : current_dir() + "/" + rank_log_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st{};
  DS_CHECK(::stat(dir.c_str(), &st) != 0 || S_ISDIR(st.st_mode),
           "--enable_each_rank_log: '" << rank_log_dir << "' exists and is not a directory");
  char ts[32];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::localtime_r(&now, &tm);
  std::strftime(ts, sizeof ts, "%Y%m%d%H%M%S", &tm);
  return dir + "/" + ts + "_rank";
}

CommandOptions command_options(const LaunchFlags& f) {
  CommandOptions co;
  co.launcher = parse_launcher(f.launcher);
  co.launcher_args = f.launcher_args;
  co.no_local_rank = f.no_local_rank;
  co.as_root = ::geteuid() == 0;
  co.shim = self_path();
  co.program = f.rest.front();
  co.program_args.assign(f.rest.begin() + 1, f.rest.end());
  co.module = f.module;
  co.no_python = f.no_python;
  co.ssh_port = f.ssh_port;
  co.bind_cores = f.bind_cores || f.core_list_given;
  if (f.core_list_given) co.core_list = format_core_list(parse_core_list(f.core_list));
  co.rank_log_prefix = rank_log_prefix(f.rank_log_dir);
  return co;
}

// Every host needs a core per local rank; on this machine the listed cores must exist
// (under srun even a one-host job may run on another machine than dsrun's).
void check_core_binding(const Resolution& res, const Backend& engine, const std::string& core_list) {
  const std::vector<int> cores = core_list.empty() ? std::vector<int>{} : parse_core_list(core_list);
  for (const auto& [h, slots] : res.world) {
    if (!slots.empty() && !cores.empty()) cores_for_rank(cores, 0, static_cast<int>(slots.size()));
  }
  if (res.multi_node || !engine.local_job_runs_here || cores.empty()) return;
  std::vector<int> here = allowed_cores(), missing;
  for (int c : cores) {
    if (!std::binary_search(here.begin(), here.end(), c)) missing.push_back(c);
  }
  DS_CHECK(missing.empty(), "--bind_core_list " << core_list << ": core(s) " << format_core_list(missing)
                                << " are not available on this machine (dsrun may use "
                                << format_core_list(here) << ")");
}

// --dry_run: the world as JSON, then the command.
void print_dry_run(const Resolution& res, const Command& cmd) {
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
}

// --save_pid: DeepSpeed's /tmp/<pid>.deepspeed; an existing one is an error, as there.
std::string write_pid_file() {
  const std::string pid_file = "/tmp/" + std::to_string(::getpid()) + ".deepspeed";
  int fd = ::open(pid_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  DS_CHECK(fd >= 0, "--save_pid: cannot create '" << pid_file << "': " << std::strerror(errno));
  std::string text = std::to_string(::getpid()) + "\n";
  bool wrote = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  DS_CHECK(wrote, "--save_pid: cannot write '" << pid_file << "'");
  return pid_file;
}

// The launch as DeepSpeed's runner does it: flags, the resolved world, the environment to
// export, the engine command; then checks (installed, ssh), and the supervised run.
int launch(int argc, char** argv) {
  LaunchFlags f;
  if (auto rc = parse_launch_flags(argc, argv, f)) return *rc;
  const Say say = check_launch_flags(f);
  const CommandOptions co = command_options(f);
  const Backend& engine = backend(co.launcher);

  EnvList env = current_environ();
  Resolution res = resolve(f.ro, env, [&] { return count_local_devices(env); });
  for (const auto& n : res.notes) say(2, n);
  if (co.bind_cores) check_core_binding(res, engine, f.core_list_given ? f.core_list : std::string());
  if (f.ssh_port > 0 && !res.multi_node) {
    say(2, "--ssh_port " + std::to_string(f.ssh_port) + " is not used: a single-machine job starts no ssh");
  }
  if (res.unset_cuda_visible) {
    ::unsetenv("CUDA_VISIBLE_DEVICES");
    std::erase_if(env, [](const auto& kv) { return kv.first == "CUDA_VISIBLE_DEVICES"; });
  }
  std::string cwd = current_dir();
  // An env file named by DS_ENV_FILE must exist (a typo is not skipped in silence); the
  // default .deepspeed_env is optional.
  std::vector<std::string> env_file_warnings;
  EnvList from_files = read_env_files(env_file_paths(env, cwd), env_file_named(env), &env_file_warnings);
  for (const auto& w : env_file_warnings) say(2, "warning: " + w);
  EnvList exports = collect_exports(env, from_files, cwd, res.multi_node);
  Command cmd = build_command(res, co, exports, env);
  // Before anything starts (and in --dry_run): a variable too big for exec is named here.
  check_exec_size(cmd, env, system_exec_limits());

  say(0, "command: " + shell_join(cmd.argv));
  if (f.dry_run) {
    print_dry_run(res, cmd);
    return 0;
  }
  check_installed(engine, dsrun::in_path, [](const std::vector<std::string>& argv) {
    std::string output;
    dsrun::run_capture(argv, output);
    return output;
  });
  if (res.multi_node && res.source == PoolSource::Hostfile && !f.no_ssh_check && engine.uses_ssh) {
    ssh_check(res.world.front().first, env, f.ssh_port);
  }
  if (!co.rank_log_prefix.empty()) {
    make_dirs(co.rank_log_prefix.substr(0, co.rank_log_prefix.find_last_of('/')), "--enable_each_rank_log");
    say(1, "each rank's output goes to " + co.rank_log_prefix + "<RANK>.log");
  }
  std::string pid_file;
  if (f.save_pid) {
    pid_file = write_pid_file();
    say(1, "pid " + std::to_string(::getpid()) + " saved in " + pid_file);
  }
  int rc = dsrun::run_supervised(cmd.argv, 10);
  if (!pid_file.empty()) ::unlink(pid_file.c_str());
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  ds::log::set_tool("dsrun");  // diagnostics on stderr, no rank tag
  bool shim = argc > 1 && std::strcmp(argv[1], "--rank_shim") == 0;
  try {
    ds::env::check_all();  // a bad DS_* value: one error line before any work
    return shim ? rank_shim(argc, argv) : launch(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dsrun: error: %s\n", ds::user_message(e).c_str());
    return shim ? 127 : 2;
  }
}
