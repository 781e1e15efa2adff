// GradReducer: the data-parallel gradient reduction of one engine (DeepSpeed's
// allreduce_bucket / the ipg buckets of stage_1_and_2.py; docs/dev/engine.md "The gradient
// reducer").
//
// Buckets are ranges of the flat gradient space, reduce_bucket_size elements each, laid
// from the END of the space backwards (backward finishes the last parameters first). The
// engine tells the reducer when a backward starts, which parameters' gradients are ready
// while it runs (a bucket launches its non-blocking reduction once all its parameters
// reported, in bucket order so every rank issues the same sequence), when it ended, and to
// finish before the step. Stage 0 all-reduces a bucket (every rank steps every element);
// stages 1 and 2 reduce each rank's part of it only to that rank (the bucket's intersections
// with the rank slices, Communicator::ireduce_scatter_in_place: half an all-reduce's bytes),
// since a rank steps, norms and checks only its own slice; the rest of the bucket is left
// unspecified and is zeroed (stage 1: zero_grads) or released (stage 2) before it is read. The reducer owns the communication-dtype copies, the averaging
// factors (predivide / prescale, the rest applied by the optimizer as post_factor()) and,
// under ZeRO-2, the release of the gradient pages (host) or chunks (CUDA device) outside this
// rank's slice as soon as their bucket is reduced. On a device, released chunks have no
// memory behind them at all, so the reducer also maps them again before backward writes
// them: it is the module's GroupHooks then and maps each group's chunks as backward
// acquires the group (the whole space at once for a module without groups).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/module.h"
#include "ds/core/timer.h"
#include "ds/engine/partition.h"
#include "ds/mpi/communicator.h"
#include "grad_sync.h"
#include "param_store.h"

namespace ds::engine {

struct ReducerOptions {
  std::int64_t bucket_size = 0;  // zero_optimization.reduce_bucket_size (elements)
  DType comm_dtype = DType::F32;  // communication_data_type
  bool prescale_gradients = false;
  double predivide_factor = 1.0;
  bool accum_fp32 = false;       // the store folds reduced gradients after every backward
  bool release_grads = false;    // ZeRO-2 with more than one rank: release reduced pages
  // ZeRO-2 on a device: the module's parameter groups (Module::parameter_groups()), whose
  // gradient chunks acquire() maps; empty: begin_backward maps the whole space.
  std::vector<ParamGroup> groups;
};

class GradReducer final : public GradSync, public GroupHooks {
 public:
  // comm: the communicator the gradients travel over (NCCL for a CUDA module).
  GradReducer(const PartitionMap& map, ParamStore& store, Communicator& comm, const ReducerOptions& o, Timers& timers);
  ~GradReducer() override;  // waits for reductions still in flight (they own their buffers)
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  // A backward starts; boundary: it is the last micro-batch of the accumulation cycle.
  // It reduces under ZeRO-2 and fp32 accumulation on every micro-batch, else at the boundary.
  void begin_backward(bool boundary) override;
  // Module::backward's callback: parameter i's gradient is final for this backward.
  void grad_ready(std::size_t i) override;
  // The backward returned: launch what never reported; ZeRO-2 and fp32 accumulation wait
  // for everything here (and ZeRO-2 releases), the other stages in finish().
  void end_backward() override;
  // Before the step: every gradient this rank steps is reduced (reduces now if no
  // boundary backward did).
  void finish() override;

  // Multiply the reduced sums by this (the part of the averaging not applied before the
  // reduction): the optimizer applies it with 1/loss_scale and the clip coefficient.
  double post_factor() const override { return post_factor_; }
  std::size_t scratch_bytes() const override { return comm_buf_.bytes(); }  // communication-dtype copies
  std::size_t peak_resident() const override { return grad_peak_resident_; }  // ZeRO-2: most grad bytes at a release

  // ZeRO-2 on a device (the engine sets the reducer as the module's hooks): a Backward
  // acquire maps the chunks of the group's parameters whose gradients are not final yet (a
  // final one's chunks may already be released, and nothing writes them again this
  // backward). Forward brackets and release() do nothing.
  void acquire(std::size_t group, Pass pass) override;
  void release(std::size_t, Pass) noexcept override {}

 private:
  struct Bucket {
    std::size_t begin = 0, end = 0;  // global flat range [begin, end)
    std::size_t wire = 0;            // element offset of its communication copy in comm_buf_
    int params_total = 0;            // parameters intersecting the range
    int params_ready = 0;            // grad_ready calls seen for them this backward
    bool launched = false;
    CommWork work;
    // Stages 1/2: elements of the range in each rank's slice (rank order; sum = end - begin).
    std::vector<std::size_t> blocks;
    std::size_t own_begin = 0, own_end = 0;  // this rank's part of the range (global, may be empty)
  };

  void build_buckets(std::int64_t bucket_size);
  void launch_ready_buckets();  // launches complete buckets in index order
  void launch_bucket(std::size_t k);
  void finish_bucket(Bucket& b);
  void finish_and_release(std::size_t k);  // ZeRO-2: wait bucket k, drop its non-partition pages
  void reap_finished_buckets();            // ZeRO-2: finish_and_release what is already done
  void populate_bucket(std::size_t k);     // ZeRO-2 host: prefault bucket k's released pages at once
  void make_params_resident(std::size_t first, std::size_t count);  // ZeRO-2 device: map their chunks
  void launch_all_and_wait();

  const PartitionMap& map_;
  ParamStore& store_;
  Communicator& comm_;
  ReducerOptions o_;
  Timers& timers_;
  DType wdtype_;
  int world_ = 1;
  bool slice_ranks_only_ = false;  // stages 1/2 with several ranks: each bucket part goes to the rank that holds it only
  GradPages* pages_ = nullptr;             // ZeRO-2: the gradients' pages / chunks, else nullptr
  std::size_t keep_lo_ = 0, keep_hi_ = 0;  // byte range of pages_ never released
  std::size_t max_in_flight_ = 0;          // ZeRO-2: buckets reducing at once (waits for the oldest)
  std::size_t grad_peak_resident_ = 0;
  double pre_factor_ = 1.0, post_factor_ = 1.0;
  HostBuffer comm_buf_;  // comm_dtype copies, only when comm_dtype != wdtype: padded_numel
                         // elements (stages 0/1), max_in_flight_ buckets (ZeRO-2, reused)

  std::vector<Bucket> buckets_;                          // buckets_[0] holds the END of the flat space
  std::vector<std::vector<std::size_t>> param_buckets_;  // param -> buckets it intersects
  std::vector<std::uint8_t> param_ready_;                // grad_ready seen this backward
  std::size_t next_launch_ = 0;                          // buckets launch strictly in index order
  std::size_t next_finish_ = 0;                          // ZeRO-2: ... and finish in index order
  bool reducing_ = false;                                // this backward reduces
  bool pending_ = false;                                 // stages 0/1: launched, waited in finish()
};

}  // namespace ds::engine
