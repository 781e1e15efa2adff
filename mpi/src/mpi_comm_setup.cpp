// MpiComm::Impl setup and teardown (mpi_comm_impl.h): the node and cross-node communicators,
// the CPU count behind `oversubscribed`, the shared-memory window, and the collective deadline.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "ds/core/error.h"
#include "ds/mpi/init.h"
#include "mpi_comm_impl.h"

namespace ds {

namespace {
// "stopped" or "gone" for a process on this node that cannot take part in a collective, ""
// when it runs (from /proc/PID/stat: T/t stopped or traced, Z zombie, X dead; no entry: gone).
std::string process_state(std::int64_t pid) {
  if (pid <= 0) return {};
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%lld/stat", static_cast<long long>(pid));
  std::FILE* f = std::fopen(path, "r");
  if (!f) return "gone";
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* paren = std::strrchr(buf, ')');  // the command name may hold spaces and ')'
  if (n == 0 || !paren || paren[1] != ' ') return {};
  switch (paren[2]) {
    case 'T': case 't': return "stopped";
    case 'Z': case 'X': return "gone";
    default: return {};
  }
}
}  // namespace

void MpiComm::Impl::setup(MPI_Comm parent) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) DS_THROW("MpiComm: MPI is not initialized (call ds::init_distributed() first)");
  MPI_Query_thread(&thread_level);
  DS_MPI_CHECK(MPI_Comm_dup(parent, &comm));
  DS_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  DS_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  DS_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (opt.ranks_per_node > 0) {
    DS_MPI_CHECK(MPI_Comm_split(comm, rank / opt.ranks_per_node, rank, &node));
  } else {
    DS_MPI_CHECK(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node));
  }
  DS_MPI_CHECK(MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN));
  DS_MPI_CHECK(MPI_Comm_rank(node, &node_rank));
  DS_MPI_CHECK(MPI_Comm_size(node, &node_size));
  int leader = node_rank == 0 ? 1 : 0;
  DS_MPI_CHECK(MPI_Allreduce(&leader, &nnodes, 1, MPI_INT, MPI_SUM, comm));
  int mm[2] = {node_size, -node_size}, out[2] = {0, 0};
  DS_MPI_CHECK(MPI_Allreduce(mm, out, 2, MPI_INT, MPI_MAX, comm));
  uniform = out[0] == -out[1];
  DS_MPI_CHECK(MPI_Comm_split(comm, node_rank, rank, &cross));
  DS_MPI_CHECK(MPI_Comm_set_errhandler(cross, MPI_ERRORS_RETURN));
  {
    // CPUs the node's ranks may run on: the union of their affinity masks (the same answer on
    // every rank of the node; a group of consecutive ranks counts as a node for this too).
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) CPU_ZERO(&set);
    cpu_set_t all;
    DS_MPI_CHECK(MPI_Allreduce(&set, &all, static_cast<int>(sizeof set), MPI_BYTE, MPI_BOR, node));
    const int cpus = CPU_COUNT(&all);
    oversub = opt.oversubscribed >= 0 ? opt.oversubscribed > 0 : cpus > 0 && node_size > cpus;
    // Oversubscribed, a peer that has not arrived is usually waiting for this very CPU: yield
    // almost at once (measured: 4 ranks on 2 CPUs, 4-32 KiB all_reduce 2x faster than with 256).
    spin_limit = opt.barrier_spins >= 0 ? opt.barrier_spins : oversub ? 4 : 256;
  }

  // All ranks decide alike whether to build the window (it is collective over `node`).
  if (opt.shm && node_size > 1) {
    half_bytes = std::max<std::size_t>(opt.shm_chunk_bytes / 64 * 64, 4096);
    MPI_Info info;
    DS_MPI_CHECK(MPI_Info_create(&info));
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    char* base = nullptr;
    const int rc = MPI_Win_allocate_shared(static_cast<MPI_Aint>(kCtrlBytes + 2 * half_bytes), 1, info, node, &base, &win);
    MPI_Info_free(&info);
    DS_MPI_CHECK(rc);
    DS_MPI_CHECK(MPI_Win_set_errhandler(win, MPI_ERRORS_RETURN));
    seg.resize(node_size);
    ctrl.resize(node_size);
    for (int r = 0; r < node_size; ++r) {
      MPI_Aint sz = 0;
      int disp = 0;
      DS_MPI_CHECK(MPI_Win_shared_query(win, r, &sz, &disp, &ctrl[r]));
      seg[r] = ctrl[r] + kCtrlBytes;
    }
    std::memset(base, 0, kCtrlBytes + 2 * half_bytes);  // first touch once, here, not in the first step
    *reinterpret_cast<std::int64_t*>(base + kRankOffset) = rank;
    *reinterpret_cast<std::int64_t*>(base + kPidOffset) = static_cast<std::int64_t>(getpid());
    DS_MPI_CHECK(MPI_Win_lock_all(MPI_MODE_NOCHECK, win));
    DS_MPI_CHECK(MPI_Win_sync(win));
    DS_MPI_CHECK(MPI_Barrier(node));  // every counter is zero before anyone uses the window
  }
  watchdog = std::make_shared<detail::CommWatchdog>(rank, [this](std::uint64_t seq) { return not_arrived(seq); });
  watchdog->set_timeout(opt.timeout_s);
}

// Called on the watchdog thread once, at a timeout: the node peers whose published sequence
// number is below `seq` have not called that collective (ranks on other nodes are not known).
std::string MpiComm::Impl::not_arrived(std::uint64_t seq) const {
  if (win == MPI_WIN_NULL) {
    return size == 1 ? std::string() : "which ranks did not arrive is not known (no shared-memory window)";
  }
  std::string late, stuck;
  for (int r = 0; r < node_size; ++r) {
    if (r == node_rank) continue;
    const std::uint64_t got =
        std::atomic_ref<std::uint64_t>(*reinterpret_cast<std::uint64_t*>(ctrl[r] + kArrivedOffset))
            .load(std::memory_order_acquire);
    const std::string who = std::to_string(*reinterpret_cast<const std::int64_t*>(ctrl[r] + kRankOffset));
    if (got < seq) {
      late += late.empty() ? "" : ", ";
      late += who + " (at #" + std::to_string(got) + ")";
      continue;
    }
    // Arrived, yet the collective did not finish: a peer stopped inside it (SIGSTOP, a
    // debugger) or gone leaves its part undone. Its process state says which.
    const auto pid = *reinterpret_cast<const std::int64_t*>(ctrl[r] + kPidOffset);
    const std::string state = process_state(pid);
    if (!state.empty()) {
      stuck += stuck.empty() ? "" : ", ";
      stuck += who + " (pid " + std::to_string(pid) + ", " + state + ")";
    }
  }
  std::string out;
  if (!late.empty()) out = "ranks that did not arrive: " + late;
  if (!stuck.empty()) out += (out.empty() ? "" : "; ") + std::string("ranks that arrived but cannot progress: ") + stuck;
  if (out.empty()) out = "every rank on this node arrived";
  if (nnodes > 1) out += "; ranks on other nodes are not known";
  return out;
}

MpiComm::Impl::~Impl() {
  if (watchdog) watchdog->shutdown();  // its not_arrived() reads this object
  {
    std::lock_guard lk(mu);
    stop = true;
  }
  cv.notify_all();
  if (worker.joinable()) worker.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (win != MPI_WIN_NULL) {
    MPI_Win_unlock_all(win);
    MPI_Win_free(&win);
  }
  for (MPI_Comm* c : {&cross, &node, &comm})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

}  // namespace ds
