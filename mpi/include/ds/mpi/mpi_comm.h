// MpiComm: ds::Communicator on host memory over MPI, with a shared-memory fast path.
//
// Plain path: MPI_Allreduce / MPI_Reduce_scatter_block / MPI_Allgather / MPI_Bcast on our
// own duplicate of the communicator (MPI_ERRORS_RETURN), and the MPI_I* forms for the
// non-blocking calls. F16 and BF16 use user-defined MPI_Ops over a 2-byte contiguous type;
// avg is sum then divide by size(). Counts above max_count (INT_MAX) are split.
//
// Shared-memory path (docs/dev/communication.md "Shared-memory collectives"): ranks of one node
// (MPI_Comm_split_type SHARED) share one MPI-3 window (MPI_Win_allocate_shared, allocated
// once, two half-segments per rank used alternately, so a chunk needs only the barriers that
// order it). all_reduce: each rank copies its chunk in, barrier, reduces its own slice from
// every peer's segment in rank order (so the result is the same on every rank) into its
// segment and its buffer in one pass, barrier, copies the peers' slices out; up to
// shm_oneshot_max on one node (not oversubscribed) every rank reduces the whole message after
// a single barrier, same order, same bits. Across nodes (uniform ranks per node): the reduced slice is
// all-reduced among the ranks with the same local rank (one MPI_Allreduce per slice) before
// the copy-out. reduce_scatter and all_gather use the window inside a single node and plain
// MPI across nodes. Where Open MPI's single-copy (CMA) transfers match or beat two copies
// through the window -- mid-sized all_reduce / all_gather while every node rank has a core of
// its own -- messages take plain MPI (the plain_* bands, measured with bench/comm/comm_bench).
//
// Non-blocking shm operations run on a progress thread (one per communicator, FIFO) when MPI
// provides MPI_THREAD_MULTIPLE, so they overlap with the caller's compute; otherwise they
// run to completion inside the i*() call. Non-blocking plain-path operations are MPI_I*
// requests on the caller's thread. A blocking shm operation first waits for the queued ones.
//
// Deadline (docs/dev/communication.md "Collective deadline"): a wait in a collective longer than
// timeout_s ends the job with one line naming the collective, its sequence number and the
// node ranks that did not arrive (a watchdog thread; the collectives themselves are unchanged).
#pragma once

#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "ds/mpi/comm_backends.h"
#include "ds/mpi/communicator.h"

namespace ds {

namespace detail {
struct MpiRuntime;
struct MpiCommTesting;  // tests' access to the plain-MPI collectives (mpi/src/mpi_comm_testing.h)
}  // namespace detail

// Message sizes [from, below) in bytes; empty when from >= below.
struct SizeBand {
  std::size_t from = 0, below = 0;
  bool contains(std::size_t bytes) const { return bytes >= from && bytes < below; }
};

struct MpiCommOptions {
  bool shm = true;                              // false: plain MPI only (config communication.shared_memory)
  std::size_t shm_chunk_bytes = 1u << 20;       // per half-segment
  // all_reduce on one node up to this many bytes, while the node's ranks do not outnumber
  // its CPUs: one barrier, every rank reduces the whole message (0 turns it off).
  std::size_t shm_oneshot_max = 32u << 10;
  // Sizes are the full buffer: all_reduce's buffer, reduce_scatter's send, all_gather's recv.
  // Smaller messages than shm_min_* take plain MPI.
  std::size_t shm_min_all_reduce = 0;
  std::size_t shm_min_reduce_scatter = 0;
  std::size_t shm_min_all_gather = 0;
  // Blocking calls inside these bands take plain MPI unless the node is oversubscribed (with
  // more ranks than CPUs the window won at every size measured). Non-blocking calls run by the progress thread
  // keep the window (it overlaps compute; MPI_I* progresses only inside MPI calls).
  // all_reduce: with the caller's buffers on 2 MiB pages the window is slower than MPI up to
  // 16 MiB, while from 32 MiB up it takes half of MPI's time (figures:
  // bench/results/code-comment-history.md).
  SizeBand plain_all_reduce{128u << 10, 32u << 20};
  SizeBand plain_reduce_scatter{0, 0};
  // all_gather: Open MPI copies each peer block once, straight between the ranks' buffers
  // (CMA); the window copies twice (own block in, peers' blocks out). With the caller's
  // buffers on 2 MiB pages (HostBuffer) MPI's copy is fast enough that at 2 ranks the window
  // wins at no size from 32 KiB; with 4 ranks on 2 CPUs it wins below 1 MiB and at 32 MiB
  // and ties between.
  SizeBand plain_all_gather{32u << 10, SIZE_MAX};
  SizeBand plain_all_gather_oversubscribed{1u << 20, 32u << 20};
  // all_reduce on an oversubscribed node, likewise: the window is no faster than MPI from
  // 512 KiB below 8 MiB and faster at 8 MiB (figures: bench/results/code-comment-history.md).
  SizeBand plain_all_reduce_oversubscribed{512u << 10, 8u << 20};
  // In place (send is this rank's block of recv) MPI copies only the peers' blocks while the
  // window still needs two copies, so no size above 32 KiB gained.
  SizeBand plain_all_gather_in_place{32u << 10, SIZE_MAX};
  // Whether the node's ranks outnumber the CPUs they may run on (the union of their affinity
  // masks): -1 detects it; 0 / 1 say so (DS_COMM_OVERSUBSCRIBED). Oversubscribed: only the
  // *_oversubscribed bands, no one-shot all_reduce, barriers yield after 4 spins.
  int oversubscribed = -1;
  // Every message of at least `bytes` takes the window (clears the bands).
  void set_shm_min(std::size_t bytes) {
    shm_min_all_reduce = shm_min_reduce_scatter = shm_min_all_gather = bytes;
    plain_all_reduce = plain_reduce_scatter = plain_all_gather = plain_all_gather_in_place =
        plain_all_gather_oversubscribed = plain_all_reduce_oversubscribed = SizeBand{};
  }
  int ranks_per_node = 0;                       // >0: consecutive groups act as nodes (tests; DS_COMM_RANKS_PER_NODE)
  std::size_t max_count = INT_MAX;              // split limit for MPI counts (tests lower it)
  bool progress_thread = true;                  // false runs shm i*() inline (config communication.progress_thread)
  // Pause-spins of a window barrier before it yields the CPU; -1: 256, or 4 when the node's
  // ranks outnumber its CPUs.
  int barrier_spins = -1;
  // Seconds a rank may wait in one collective (for peers that do not arrive: a stopped or
  // dead rank) before the job ends with one line naming the collective and its sequence
  // number (MPI_Abort); 0 waits forever. Default 1800, torch's default_pg_timeout.
  // DS_COMM_TIMEOUT=SECONDS sets it and then wins over set_timeout() (the config's value).
  double timeout_s = 1800;
  bool timeout_from_env = false;
  // The defaults above, overridden by the registry's debug variables DS_COMM_SHM,
  // DS_COMM_PROGRESS_THREAD, DS_COMM_RANKS_PER_NODE, DS_COMM_OVERSUBSCRIBED and by
  // DS_COMM_TIMEOUT (ds/core/env.h). The sizes, bands and spins are constants here; benchmarks
  // set the fields directly.
  static MpiCommOptions from_env();
};

class MpiComm final : public Communicator {
 public:
  // Collective over `comm`. Duplicates it (the caller keeps ownership of `comm`).
  explicit MpiComm(MPI_Comm comm, MpiCommOptions options = MpiCommOptions::from_env(),
                   std::shared_ptr<detail::MpiRuntime> runtime = nullptr);
  ~MpiComm() override;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;

  int rank() const override;
  int size() const override;
  std::string_view backend() const override { return kMpiBackend; }

  void all_reduce(TensorView buf, ReduceOp op) override;
  CommWork iall_reduce(TensorView buf, ReduceOp op) override;
  void reduce_scatter(TensorView send, TensorView recv, ReduceOp op) override;
  CommWork ireduce_scatter(TensorView send, TensorView recv, ReduceOp op) override;
  // The window when reduce_scatter of buf.bytes() would take it, else one MPI_Ireduce per
  // non-empty block, rooted at the rank that holds it (in max_count pieces).
  CommWork ireduce_scatter_in_place(TensorView buf, std::span<const std::size_t> counts, ReduceOp op) override;
  void all_gather(TensorView send, TensorView recv) override;
  CommWork iall_gather(TensorView send, TensorView recv) override;
  void broadcast(TensorView buf, int root) override;
  void barrier() override;
  // The collective deadline (MpiCommOptions::timeout_s); ignored when DS_COMM_TIMEOUT is set.
  void set_timeout(double seconds) override;
  double timeout() const override;
  // Turns the window path / progress thread off (config `communication`); DS_COMM_SHM and
  // DS_COMM_PROGRESS_THREAD, when set, win. Waits for the queued non-blocking calls first.
  void set_paths(const CommPaths& paths) override;

  bool shm_enabled() const;     // a window exists (more than one rank per node) and the path is on
  // Whether an all_reduce / reduce_scatter / all_gather of `bytes` (the full buffer, as in the
  // options; the i*() form when nonblocking) takes the window rather than plain MPI. Same
  // answer on every rank.
  bool shm_all_reduce_for(std::size_t bytes, bool nonblocking = false) const;
  bool shm_reduce_scatter_for(std::size_t bytes, bool nonblocking = false) const;
  bool shm_all_gather_for(std::size_t bytes, bool nonblocking = false, bool in_place = false) const;
  bool oversubscribed() const;  // as detected or set in the options (MpiCommOptions::oversubscribed)
  int node_size() const;        // ranks in this rank's node group
  int num_nodes() const;
  bool uses_progress_thread() const;
  MPI_Comm mpi_comm() const;    // our duplicate
  // Collective: the ranks with the same `color` as one communicator, ordered by `key`
  // (MPI_Comm_split), with this one's options and runtime.
  std::shared_ptr<MpiComm> split(int color, int key) const;
  const MpiCommOptions& options() const;

  struct Impl;

 private:
  friend struct detail::MpiCommTesting;
  // The plain-MPI versions of the collectives (no window), which the tests compare the
  // window path to bit for bit.
  void all_reduce_mpi(TensorView buf, ReduceOp op);
  void reduce_scatter_mpi(TensorView send, TensorView recv, ReduceOp op);
  void reduce_scatter_in_place_mpi(TensorView buf, std::span<const std::size_t> counts, ReduceOp op);
  void all_gather_mpi(TensorView send, TensorView recv);

  std::unique_ptr<Impl> impl_;
};

}  // namespace ds
