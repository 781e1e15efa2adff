// From command-line options, hostfile and environment to the resolved job: DeepSpeed's
// runner pipeline (launcher/runner.py main) with the fixes listed in docs/user/launching.md.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "ds/launch/env_file.h"
#include "ds/launch/filter.h"

namespace ds::launch {

struct ResolveOptions {
  std::string hostfile = "/job/hostfile";
  // The user named the hostfile (-H / --hostfile): then a missing file is an error instead
  // of "no hostfile" (a typo must not quietly turn a cluster job into one local rank).
  bool hostfile_given = false;
  std::string include;
  std::string exclude;
  int num_nodes = -1;  // -1 = not given; 0 = no limit
  int num_gpus = -1;   // -1 = not given; 0 = no limit
  std::string master_addr;
  int master_port = 29500;
  bool force_multi = false;
};

enum class PoolSource { Hostfile, Slurm, Local };

struct Resolution {
  WorldInfo world;
  std::string master_addr;
  int master_port = 29500;
  PoolSource source = PoolSource::Local;
  bool multi_node = false;            // --force_multi or more than one host
  bool unset_cuda_visible = false;    // the launcher removes CUDA_VISIBLE_DEVICES from its env
  std::vector<std::string> notes;     // informational messages for stderr
};

// Devices on this machine when there is no hostfile: NVIDIA GPUs (/proc/driver/nvidia/gpus),
// else LOCAL_SIZE from `environ` when > 0, else NUMA nodes with CPUs, else 1 (DeepSpeed's
// CUDA and CPU accelerator rules).
struct LocalDevices {
  int count = 0;
  bool gpus = false;  // true when the count is NVIDIA GPUs (not a CPU rank count)
};
LocalDevices count_local_devices(const EnvList& environ);

// The pool from a Slurm allocation: hosts from SLURM_JOB_NODELIST (or SLURM_NODELIST), slots
// from SLURM_TASKS_PER_NODE, else SLURM_JOB_CPUS_PER_NODE. Returns false outside an
// allocation (no SLURM_JOB_ID or no node list).
bool slurm_pool(const EnvList& environ, Pool& pool);

// `devices` is called only when the pool comes from this machine.
Resolution resolve(const ResolveOptions& opts, const EnvList& environ,
                   const std::function<LocalDevices()>& devices);

}  // namespace ds::launch
