// Engine command lines and the per-rank shim's computations.
#include "ds/launch/command.h"

#include <algorithm>
#include <cctype>

#include "ds/core/error.h"
#include "ds/launch/shell.h"
#include "ds/launch/world_info.h"

namespace ds::launch {
namespace {

// Hosts with at least one slot, with their counts (0-slot hosts run nothing).
std::vector<std::pair<std::string, int>> active_hosts(const WorldInfo& w) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& [h, s] : w) {
    DS_CHECK(valid_host_name(h), "invalid host name '" << h << "'");
    if (!s.empty()) out.emplace_back(h, static_cast<int>(s.size()));
  }
  return out;
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
  const Backend& engine = backend(opts.launcher);
  DS_CHECK(opts.ssh_port == 0 || engine.no_ssh_port == nullptr,
           "--ssh_port works with --launcher openmpi only (" << engine.name << ": " << engine.no_ssh_port << ")");

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
  backend(opts.launcher).build(EngineJob{res, opts, hosts, total, extra, environ}, cmd);
  cmd.argv.insert(cmd.argv.end(), shim.begin(), shim.end());
  return cmd;
}

RankEnv compute_rank_env(const WorldInfo& world, const EnvList& environ) {
  RankEnv r;
  int rank = -1, size = -1, local = -1;
  const char* from = nullptr;
  std::string tried;
  for (const RankVars& v : rank_sources()) {
    tried += (tried.empty() ? "" : ", ") + std::string(v.rank);
    if (from != nullptr || !parse_int_env(environ, v.rank, rank)) continue;
    from = v.rank;
    int same = -1;
    if (v.agree == nullptr || (parse_int_env(environ, v.agree, same) && same == rank)) {
      parse_int_env(environ, v.size, size);
      parse_int_env(environ, v.local_rank, local);
    }
  }
  DS_CHECK(from != nullptr, "no rank in the environment (" << tried << "): "
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
