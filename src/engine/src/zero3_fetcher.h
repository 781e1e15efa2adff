// GroupFetcher: ZeRO stage 3's parameter and gradient traffic (docs/dev/engine.md "Stage 3";
// DeepSpeed's PartitionedParameterCoordinator and stage3.py's reduce-scatter of ipg buckets).
//
// The module brackets each use of a parameter group with GroupHooks::acquire/release (ds/core/
// module.h). acquire(g) makes group g's parameters resident in the flat space: a gather of
// every rank's piece (all-gather), started earlier as a prefetch when the fetcher predicted
// the use, or now. Prediction: the first forward and backward record the order of
// acquisitions (the trace); later passes follow it and keep gathers in flight ahead of the
// module, up to stage3_prefetch_bucket_size elements and stage3_max_live_parameters
// resident. With offload_param nvme a gather begins with the read of this rank's piece from
// the swap file, started when the gather is decided (a prefetch's too) and finished when the
// bytes are needed: at one rank when the group is acquired; at several, at the next acquire
// (the read had the current group's compute to run), when the all-gather starts. release(g) frees the group's pages unless the group is persistent (at most
// stage3_param_persistence_threshold elements; stage3_model_persistence_threshold in all) or
// the trace says it is used again within stage3_max_reuse_distance elements. In backward,
// once every parameter of a group reported its gradient final, the group's flat gradients
// are reduce-scattered (non-blocking, overlapping the backward of the next groups; as many
// groups in flight as reduce_bucket_size elements hold, at least two) into a scratch piece
// that is then added into this rank's fp32 gradient partition, and their pages are released. overlap_comm false: no prefetch, and each reduce-scatter is waited at once.
//
// Collective order: every rank's module acquires the same groups in the same order and
// reports the same gradients, so the gathers and reduce-scatters the fetcher starts from
// those calls form the same sequence on every rank (an all-gather behind a piece's read
// starts at a fixed call too, never when the read happens to be done). Non-blocking operations are completed
// strictly in the order they were started (the Communicator's rule): waiting for one
// completes every older one first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/module.h"
#include "ds/core/timer.h"
#include "ds/mpi/communicator.h"
#include "grad_sync.h"
#include "zero3_space.h"

namespace ds::engine {

struct FetchOptions {
  std::size_t prefetch_elems = 50000000;           // stage3_prefetch_bucket_size
  std::size_t max_live = 1000000000;               // stage3_max_live_parameters
  std::size_t max_reuse = 1000000000;              // stage3_max_reuse_distance
  std::size_t persistence_threshold = 100000;      // stage3_param_persistence_threshold
  std::size_t model_persistence_threshold = SIZE_MAX;  // stage3_model_persistence_threshold
  bool overlap = true;                             // overlap_comm
  std::size_t reduce_bucket = 500000000;           // reduce_bucket_size: gradients in flight
  bool whole_model = false;  // the module declares no groups: the engine's calls bracket group 0
  DType comm_dtype = DType::F32;                   // communication_data_type
};

class GroupFetcher final : public GroupHooks, public GradSync {
 public:
  GroupFetcher(const PartitionMap& map, Zero3Store& store, Communicator& comm, const FetchOptions& o,
               Timers& timers);
  ~GroupFetcher() override;  // waits for operations in flight (they own their buffers)
  GroupFetcher(const GroupFetcher&) = delete;
  GroupFetcher& operator=(const GroupFetcher&) = delete;

  // GroupHooks (the module's calls).
  void acquire(std::size_t group, Pass pass) override;
  void release(std::size_t group, Pass pass) noexcept override;

  // GradSync (the engine's calls).
  void begin_forward() override;
  void end_forward() override;
  void begin_backward(bool boundary) override;
  void grad_ready(std::size_t param) override;
  void end_backward() override;
  void finish() override;
  void params_changed() override;
  double post_factor() const override { return 1.0 / double(world_); }
  std::size_t scratch_bytes() const override { return rs_recv_bytes_ + rs_send_.bytes(); }

  // Reporting: the most parameter elements gathered at once, and the groups kept resident.
  std::size_t peak_live_elements() const { return peak_live_; }
  std::size_t persistent_elements() const { return persistent_elems_; }

 private:
  // Reading: this rank's piece is being read from the parameter swap file (offload_param
  // nvme); the all-gather (world > 1) starts once the read is finished.
  enum class State : std::uint8_t { Released, Reading, Gathering, Resident };
  struct Group {
    State state = State::Released;
    int refs = 0;
    bool persistent = false;
    bool stale = false;            // persistent and resident, but the step changed the pieces
    std::uint64_t gather_op = 0;   // id of the gather in flight (state Gathering)
    std::uint64_t read = 0;        // the piece's read (state Reading)
    std::size_t grads_ready = 0;   // parameters that reported their gradient this backward
    bool reduced = false;          // its reduce-scatter was started this backward
  };
  struct Op {
    std::uint64_t id = 0;
    bool gather = true;
    std::size_t group = 0;
    std::size_t slot = 0;  // reduce-scatter scratch slot
    CommWork work;
  };

  void start_gather(std::size_t g);
  void start_all_gather(std::size_t g);  // this rank's piece is in its block: gather in place
  void finish_read(std::size_t g);       // Reading -> Gathering (world > 1) or Resident
  void finish_reads();                   // every Reading group, in the order the reads started
  void drop_read(std::size_t g);         // Reading -> Released (not used after all)
  void start_reduce_scatter(std::size_t g);
  void make_resident(std::size_t g, Pass pass);  // acquire's work for the outermost bracket
  void wait_until(std::uint64_t id);  // completes every operation up to id, oldest first
  void complete_front();
  void fold_gradients(std::size_t g, const void* reduced);  // piece += reduced (comm dtype)
  void release_params(std::size_t g);
  bool gather_pending(const Op& op) const;  // a gather whose group still waits for it
  void prefetch(Pass pass);
  bool keep_for_reuse(std::size_t g, Pass pass) const;
  void release_unused();  // resident, unreferenced, not persistent: gathered but not used

  const PartitionMap& map_;
  Zero3Store& store_;
  Communicator& comm_;
  FetchOptions o_;
  Timers& timers_;
  int world_ = 1;
  DType wdtype_;
  std::vector<Group> groups_;
  std::deque<Op> ops_;
  std::vector<std::size_t> reading_;  // groups in state Reading, in the order their reads started
  std::uint64_t next_id_ = 1;
  std::size_t live_ = 0, peak_live_ = 0, persistent_elems_ = 0;

  // Trace of acquisitions per pass (index 0 forward, 1 backward), recorded by the first pass
  // of each kind; the cursor is where the current pass stands in it.
  std::vector<std::size_t> trace_[2];
  bool traced_[2] = {false, false};
  std::size_t cursor_[2] = {0, 0};
  bool diverged_[2] = {false, false};

  // Reduce-scatter slots: as many groups as reduce_bucket_size elements hold, at least two
  // (DeepSpeed's two ipg buffers: one filling, one reducing); two when gradients travel in
  // another dtype (each slot then also holds a converted copy of a whole group).
  std::size_t slots_ = 2;
  void* rs_recv_ = nullptr;  // slots_ x largest piece, comm dtype (the store's reduce_scratch)
  std::size_t rs_recv_bytes_ = 0;
  HostBuffer rs_send_;   // slots_ x largest group, comm dtype (only when it differs from wdtype)
  std::size_t max_piece_ = 0, max_padded_ = 0;
  std::size_t rs_in_flight_ = 0, rs_started_ = 0;
};

}  // namespace ds::engine
