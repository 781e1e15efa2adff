// DeepSpeed's runner pipeline (launcher/runner.py main) with the fixes of docs/user/launching.md.
#include "ds/launch/resolve.h"

#include <dirent.h>

#include <fstream>
#include <string>

#include "ds/core/error.h"
#include "ds/launch/hostlist.h"

namespace ds::launch {
namespace {

int count_dir_entries(const char* path, const char* prefix) {
  DIR* d = ::opendir(path);
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = ::readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (prefix != nullptr && !name.starts_with(prefix)) continue;
    ++n;
  }
  ::closedir(d);
  return n;
}

int numa_nodes_with_cpus() {
  int n = 0;
  for (int i = 0; i < 4096; ++i) {
    std::ifstream f("/sys/devices/system/node/node" + std::to_string(i) + "/cpulist");
    if (!f) {
      if (i > 0 && n > 0) break;
      if (i > 64) break;
      continue;
    }
    std::string s;
    std::getline(f, s);
    if (!s.empty()) ++n;
  }
  return n;
}

}  // namespace

LocalDevices count_local_devices(const EnvList& environ) {
  int gpus = count_dir_entries("/proc/driver/nvidia/gpus", nullptr);
  if (gpus > 0) return {gpus, true};
  if (const std::string* ls = env_get(environ, "LOCAL_SIZE")) {
    try {
      int v = std::stoi(*ls);
      if (v > 0) return {v, false};
    } catch (const std::exception&) {
    }
  }
  int numa = numa_nodes_with_cpus();
  return {numa > 0 ? numa : 1, false};
}

bool slurm_pool(const EnvList& environ, Pool& pool) {
  pool.clear();
  const std::string* job = env_get(environ, "SLURM_JOB_ID");
  const std::string* list = env_get(environ, "SLURM_JOB_NODELIST");
  if (list == nullptr) list = env_get(environ, "SLURM_NODELIST");
  if (job == nullptr || list == nullptr || list->empty()) return false;
  std::vector<std::string> hosts = expand_hostlist(*list);
  DS_CHECK(!hosts.empty(), "SLURM_JOB_NODELIST '" << *list << "' names no hosts");
  const char* count_var = "SLURM_TASKS_PER_NODE";
  const std::string* counts = env_get(environ, count_var);
  if (counts == nullptr || counts->empty()) {
    count_var = "SLURM_JOB_CPUS_PER_NODE";
    counts = env_get(environ, count_var);
  }
  DS_CHECK(counts != nullptr && !counts->empty(),
           "inside a Slurm allocation (SLURM_JOB_ID=" << *job
               << ") but neither SLURM_TASKS_PER_NODE nor SLURM_JOB_CPUS_PER_NODE is set");
  std::vector<int> slots;
  try {
    slots = parse_tasks_per_node(*counts);
  } catch (const ds::Error& e) {
    DS_THROW(count_var << ": " << e.what());
  }
  DS_CHECK(slots.size() == hosts.size(),
           count_var << "='" << *counts << "' gives " << slots.size()
                     << " counts but SLURM_JOB_NODELIST='" << *list << "' has " << hosts.size()
                     << " hosts");
  for (std::size_t i = 0; i < hosts.size(); ++i) {
    DS_CHECK(valid_host_name(hosts[i]), "SLURM_JOB_NODELIST: invalid host name '" << hosts[i] << "'");
    for (const auto& p : pool)
      DS_CHECK(p.host != hosts[i], "SLURM_JOB_NODELIST: host '" << hosts[i] << "' listed twice");
    pool.push_back({hosts[i], slots[i]});
  }
  return true;
}

namespace {

void check_options(const ResolveOptions& opts) {
  DS_CHECK(opts.master_port > 0 && opts.master_port < 65536,
           "--master_port " << opts.master_port << " is not a TCP port (1..65535)");
  DS_CHECK(opts.num_nodes >= -1, "--num_nodes must be >= 0");
  DS_CHECK(opts.num_gpus >= -1, "--num_gpus must be >= 0");
  if (opts.master_addr.empty()) return;
  // A host name or an IPv4/IPv6 address: it travels in argv and environment only.
  bool ok = opts.master_addr.front() != '-' && opts.master_addr.size() <= 253;
  for (char c : opts.master_addr) {
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                c == '-' || c == '_' || c == ':');
  }
  DS_CHECK(ok, "--master_addr '" << opts.master_addr << "' is not a host name or IP address");
}

// The hosts to choose from: the hostfile, else the Slurm allocation, else (empty) this machine.
Pool read_pool(const ResolveOptions& opts, const EnvList& environ, Resolution& res) {
  Pool pool;
  if (read_hostfile(opts.hostfile, pool)) {
    res.source = PoolSource::Hostfile;
  } else if (opts.hostfile_given) {
    DS_THROW("hostfile '" << opts.hostfile << "' does not exist");
  } else if (slurm_pool(environ, pool)) {
    res.source = PoolSource::Slurm;
    res.notes.push_back("no hostfile at " + opts.hostfile + "; using the Slurm allocation (SLURM_JOB_NODELIST)");
  } else {
    res.source = PoolSource::Local;
  }
  return pool;
}

// --include, or on this machine alone CUDA_VISIBLE_DEVICES as "localhost:<list>" (DeepSpeed's
// runner) when no other selection was given; `derived` says the include came from it.
std::string include_filter(const ResolveOptions& opts, const EnvList& environ, Resolution& res, bool& derived) {
  derived = false;
  if (res.source != PoolSource::Local) return opts.include;
  const std::string* cvd = env_get(environ, "CUDA_VISIBLE_DEVICES");
  if (cvd == nullptr || cvd->empty()) return opts.include;
  res.unset_cuda_visible = true;
  if (!opts.include.empty() || !opts.exclude.empty() || opts.num_nodes > 1 || opts.num_gpus > 0) {
    res.notes.push_back("ignoring CUDA_VISIBLE_DEVICES=" + *cvd +
                        " because --include/--exclude/--num_nodes/--num_gpus was given");
    return opts.include;
  }
  derived = true;
  return "localhost:" + *cvd;
}

// This machine alone: its devices are the slots and the master is 127.0.0.1. Returns true when
// the slots are CPUs (no GPU found), which --num_gpus may then exceed.
bool use_local_pool(const ResolveOptions& opts, const std::function<LocalDevices()>& devices, Resolution& res,
                    Pool& pool) {
  LocalDevices dev = devices();
  DS_CHECK(dev.count > 0, "no hostfile at " << opts.hostfile << " and no local devices: unable to proceed");
  pool = {{"localhost", dev.count}};
  if (!opts.master_addr.empty() && opts.master_addr != "127.0.0.1") {
    res.notes.push_back("single machine without hostfile: --master_addr " + opts.master_addr +
                        " replaced by 127.0.0.1");
  }
  res.master_addr = "127.0.0.1";
  DS_CHECK(opts.num_nodes <= 1, "--num_nodes " << opts.num_nodes << " > 1 but there is no hostfile at "
                                               << opts.hostfile << " to name the other nodes");
  return !dev.gpus;
}

// --num_nodes keeps the first hosts, --num_gpus the first slots of each.
void apply_counts(const ResolveOptions& opts, bool cpu_slots, Resolution& res) {
  if (opts.num_nodes > 0 && static_cast<std::size_t>(opts.num_nodes) < res.world.size()) {
    res.world.resize(static_cast<std::size_t>(opts.num_nodes));
  }
  if (opts.num_gpus <= 0) return;
  for (auto& [host, slots] : res.world) {
    int have = static_cast<int>(slots.size());
    DS_CHECK(cpu_slots || opts.num_gpus <= have,
             "--num_gpus " << opts.num_gpus << " exceeds the " << have << " slots of host '" << host << "'");
    slots.resize(static_cast<std::size_t>(opts.num_gpus));
    for (int i = 0; i < opts.num_gpus; ++i) slots[static_cast<std::size_t>(i)] = i;
  }
}

}  // namespace

Resolution resolve(const ResolveOptions& opts, const EnvList& environ,
                   const std::function<LocalDevices()>& devices) {
  Resolution res;
  res.master_port = opts.master_port;
  check_options(opts);
  Pool pool = read_pool(opts, environ, res);
  bool derived_include = false;
  const std::string include = include_filter(opts, environ, res, derived_include);
  if ((opts.num_nodes >= 0 || opts.num_gpus >= 0) && (!include.empty() || !opts.exclude.empty())) {
    DS_THROW("cannot combine --num_nodes/--num_gpus with --include/--exclude"
             << (derived_include ? " (the include came from CUDA_VISIBLE_DEVICES; unset it)" : ""));
  }
  const bool cpu_slots = res.source == PoolSource::Local && use_local_pool(opts, devices, res, pool);
  res.world = apply_filters(pool, include, opts.exclude);
  if (res.master_addr.empty()) {
    res.master_addr = opts.master_addr.empty() ? res.world.front().first : opts.master_addr;
  }
  apply_counts(opts, cpu_slots, res);
  long total = 0;
  for (const auto& [h, s] : res.world) total += static_cast<long>(s.size());
  DS_CHECK(total > 0, "the resolved job has no slots (every host has slots=0)");
  res.multi_node = opts.force_multi || res.world.size() > 1;
  return res;
}

}  // namespace ds::launch
