// The training engine: DeepSpeed's deepspeed.initialize() and DeepSpeedEngine in C++
// (DeepSpeed's runtime/engine.py and runtime/zero/stage_1_and_2.py; docs/dev/engine.md).
//
//   auto [engine, optimizer, scheduler] = ds::initialize("ds.json", model);   // or a DsConfig
//   for (each micro-batch) {                 // on EVERY micro-batch, as in DeepSpeed
//     float loss = engine->forward(batch);
//     engine->backward(loss);                // grads += loss_scale/gas * dL/dparam
//     engine->step();                        // optimizer step only at the accumulation boundary
//   }
//
// All public calls except the accessors are collective over the data-parallel communicator:
// every rank calls them in the same order. The engine owns the flat parameter/gradient
// storage and binds the module's views into it once, at initialize.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ds/config/ds_config.h"
#include "ds/core/buffer.h"
#include "ds/core/module.h"
#include "ds/core/timer.h"
#include "ds/engine/memory.h"
#include "ds/engine/partition.h"
#include "ds/io/state_value.h"
#include "ds/mpi/communicator.h"
#include "ds/precision/loss_scaler.h"

namespace ds::optim { class Optimizer; struct Segment; }
namespace ds::sched { class LrScheduler; }

namespace ds {

namespace engine { class CsvMonitor; class DeviceStore; }

// Engine::load_checkpoint options (DeepSpeed's keyword arguments).
struct LoadOptions {
  bool load_module_strict = true;
  bool load_optimizer_states = true;
  bool load_lr_scheduler_states = true;
  bool load_module_only = false;
  // Called on every rank with the loaded client state and the checkpoint directory while
  // the checkpoint is validated, before anything is applied: an exception from it fails the
  // load on every rank with its message and leaves the engine untouched. For checks of the
  // caller's own (unchecksummed) state: ranges, the model it was saved with.
  std::function<void(const io::StateValue& client_state, const std::string& dir)> check_client_state;
};

class Engine {
 public:
  using LoadOptions = ds::LoadOptions;

  // Use ds::initialize(); this constructor does the work. `module` must outlive the engine.
  // comm (MPI, host memory) carries the engine's control traffic, checkpoints and, for CPU
  // modules, the gradients. For a CUDA module (module.device() == Device::Cuda) the
  // gradients and ZeRO's parameter gathers go over device_comm (NCCL), which is required
  // when comm has more than one rank.
  Engine(config::DsConfig cfg, Module& module, std::shared_ptr<Communicator> comm,
         std::shared_ptr<void> dist_keepalive = nullptr, std::shared_ptr<Communicator> device_comm = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // --- the training call pattern (collective) ---
  // Runs the module's forward on this rank's micro-batch; returns the mean loss, unscaled.
  float forward(const Batch& batch);
  // Backward with scale = loss_scale / gradient_accumulation_steps; returns loss / gas as
  // DeepSpeed does. During the last micro-batch of a cycle (every micro-batch under ZeRO-2,
  // or with fp32 grad_accum_dtype and a half working dtype) full gradient buckets start
  // their non-blocking reduction while backward runs.
  float backward(float loss);
  // Called on every micro-batch: micro_steps += 1; at the boundary averages, unscales,
  // checks overflow, clips, updates, steps the scheduler (see docs/dev/engine.md).
  void step();
  // Validation loss (no gradients, no counters).
  float evaluate(const Batch& batch) { return module_->evaluate(batch); }

  // --- checkpoints (defined in engine_checkpoint.cpp) ---
  void save_checkpoint(const std::string& save_dir, std::optional<std::string> tag = std::nullopt,
                       const io::StateValue& client_state = io::StateValue(), bool save_latest = true);
  std::optional<std::pair<std::string, io::StateValue>> load_checkpoint(
      const std::string& load_dir, std::optional<std::string> tag = std::nullopt,
      const LoadOptions& options = LoadOptions());

  // --- counters and state (DeepSpeed's names) ---
  std::int64_t global_steps() const { return global_steps_; }
  std::int64_t global_samples() const { return global_samples_; }
  std::int64_t micro_steps() const { return micro_steps_; }
  std::int64_t skipped_steps() const { return skipped_steps_; }
  // DeepSpeed: (micro_steps + 1) % gas == 0, evaluated before step() increments micro_steps.
  bool is_gradient_accumulation_boundary() const {
    return (micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0;
  }
  // True when the last step() applied an optimizer update (boundary and no overflow).
  bool was_step_applied() const { return last_step_applied_; }
  double get_lr() const;                                   // lr the NEXT optimizer step applies
  double loss_scale() const { return scaler_.scale(); }    // scale the next backward uses
  double get_global_grad_norm() const { return global_grad_norm_; }  // last boundary, unscaled, pre-clip
  std::int64_t train_batch_size() const { return cfg_.train_batch_size; }
  std::int64_t train_micro_batch_size_per_gpu() const { return cfg_.train_micro_batch_size_per_gpu; }
  std::int64_t gradient_accumulation_steps() const { return cfg_.gradient_accumulation_steps; }
  const config::DsConfig& config() const { return cfg_; }
  Communicator& comm() const { return *comm_; }
  Device device() const { return device_; }  // where the flat storage and the step live
  std::shared_ptr<Communicator> comm_ptr() const { return comm_; }
  int zero_stage() const { return map_.stage; }
  DType working_dtype() const { return wdtype_; }
  DType communication_dtype() const { return comm_dtype_; }
  const engine::PartitionMap& partition_map() const { return map_; }
  Module& module() const { return *module_; }
  optim::Optimizer* optimizer() const { return optimizer_.get(); }
  sched::LrScheduler* lr_scheduler() const { return scheduler_.get(); }
  const precision::LossScaler& loss_scaler() const { return scaler_; }

  // Bytes this rank really holds for model states (no activations). ZeRO-2 gradients are
  // measured (resident pages), see docs/dev/engine.md "Stage 2".
  engine::ModelStateBytes memory_report() const;
  // Gradient storage residency, measured now with mincore (ZeRO-2 releases the pages of
  // reduced buckets; other stages keep the whole buffer resident).
  struct GradientMemory {
    std::size_t reserved = 0;     // address space of the full-size bound gradient buffer
    std::size_t resident = 0;     // bytes of its pages resident now
    std::size_t partition = 0;    // pages kept resident for good (ZeRO-2: this rank's slice)
    std::size_t peak_resident = 0;  // most bytes resident at a release during backward
  };
  GradientMemory gradient_memory() const;

  // Full fp32 copy of the current working parameters (flat, unpadded), for tests and export.
  std::vector<float> gather_params_fp32() const;
  // Accumulated ms per phase ("forward", "backward", "reduce", "step"); reset after each
  // progress line when wall_clock_breakdown is on.
  const Timers& timers() const { return timers_; }

 private:
  friend struct EngineCheckpointAccess;

  struct Bucket {
    std::size_t begin = 0, end = 0;  // global flat range [begin, end)
    std::size_t wire = 0;            // element offset of its communication copy in comm_buf_
    int params_total = 0;            // parameters intersecting the range
    int params_ready = 0;            // grad_ready calls seen for them this backward
    bool launched = false;
    CommWork work;
  };

  void validate_config();
  // Collective: every rank must hold the same parameter names and shapes (else ds::Error on all ranks).
  void check_same_model_on_all_ranks(const std::vector<ParamInfo>& infos);
  void build_buckets();
  void on_grad_ready(std::size_t param_index);
  void launch_ready_buckets();  // launches complete buckets in index order
  void launch_bucket(std::size_t k);
  void finish_bucket(Bucket& b);
  void finish_and_release(std::size_t k);  // ZeRO-2: wait bucket k, drop its non-partition pages
  void reap_finished_buckets();            // ZeRO-2: finish_and_release what is already done
  void populate_bucket(std::size_t k);     // ZeRO-2: prefault bucket k's released pages at once
  void launch_all_and_wait();
  void zero_grads();
  void fold_into_accum();  // accum_fp32_: accum_ += grads_ (this rank's slice); grads_ = 0
  // The gradients the boundary step reads: accum_ (accum_fp32_) or the working-dtype grads.
  TensorView step_grads(std::size_t offset, std::size_t count) const;
  void boundary_step();
  void allgather_params();
  void report_progress(bool overflow, double loss, double step_ms);
  bool on_device() const { return device_ == Device::Cuda; }
  // The communicator gradients and parameter gathers use: device_comm_ for a CUDA module.
  Communicator& grad_comm() const { return on_device() ? *device_comm_ : *comm_; }
  // Working params / gradients [offset, offset + count) where they live (host or device).
  TensorView param_range(std::size_t offset, std::size_t count) const;
  TensorView grad_range(std::size_t offset, std::size_t count) const;
  // CUDA module: device -> host staging copies (params_, master_, optimizer state) before a
  // save, and back after a load (the optimizer state only when it was loaded). No-ops on
  // the CPU path.
  void device_to_host();
  void host_to_device(bool with_optimizer_state);

  // ---- configuration ----
  config::DsConfig cfg_;                    // resolved (batch sizes filled for world_)
  Module* module_ = nullptr;
  std::shared_ptr<Communicator> comm_;      // data-parallel group (all ranks)
  std::shared_ptr<void> dist_keepalive_;    // the distributed context when initialize made it
  std::shared_ptr<Communicator> device_comm_;  // NCCL group for a CUDA module's gradients (world > 1)
  Device device_ = Device::Cpu;             // module.device()
  int rank_ = 0, world_ = 1;
  DType wdtype_ = DType::F32;               // working params and grads: F32 | F16 | BF16
  DType comm_dtype_ = DType::F32;           // communication_data_type (default: wdtype_)

  // ---- flat storage (allocated once in the constructor) ----
  // map_: global layout. Parameter i occupies [map_.params[i].offset, +numel) in params_ and
  // grads_. Elements [total_numel, padded_numel) are zero padding (ZeRO only).
  engine::PartitionMap map_;
  engine::RankSlice slice_;                 // this rank's slice (stage 0: the whole space)
  std::vector<engine::SliceSegment> segments_;  // parameter pieces inside slice_
  std::vector<optim::Segment> optim_segments_;  // the same as the optimizer's Segments
  HostBuffer params_;    // padded_numel x wdtype_: working parameters (full on every rank)
  engine::PagedBuffer grads_;  // padded_numel x wdtype_: bound gradients (full address space
                         // on every rank; the Module contract binds one view per parameter).
                         // Stages 0/1 (and one rank): all pages touched once at initialize and
                         // kept. Stage 2: only the pages of slice_ stay resident (the
                         // accumulated, reduced partition gradient); every other page is
                         // released as soon as the bucket holding it has been reduced, so it
                         // reads as zero for the next backward (release_grads_).
  bool release_grads_ = false;      // stage 2 with more than one rank
  std::size_t keep_lo_ = 0, keep_hi_ = 0;  // byte range of grads_ pages never released
  std::size_t max_in_flight_ = 0;   // stage 2: buckets reducing at once (waits for the oldest)
  std::size_t grad_peak_resident_ = 0;  // stage 2: most grads_ bytes resident at a release
  HostBuffer comm_buf_;  // comm_dtype_ copies, only when comm_dtype_ != wdtype_: padded_numel
                         // elements (stages 0/1), max_in_flight_ buckets (stage 2, reused)
  HostBuffer gather_recv_;  // ZeRO all-gather staging, W x gather_chunk_ x wdtype_, only when
                            // chunks are smaller than a slice (else it gathers in place)
  std::size_t gather_chunk_ = 0;  // elements per rank per all-gather (allgather_bucket_size / W)
  // data_types.grad_accum_dtype "fp32" with a half working dtype: after every backward the
  // micro-step gradients of this rank's slice (reduced first when world > 1) are added into
  // accum_ and grads_ is zeroed, so the sum over the cycle is rounded once, in fp32; the
  // boundary step reads accum_. Element j is global flat element slice_.offset + j.
  bool accum_fp32_ = false;
  HostBuffer accum_;     // slice_.count x F32 when accum_fp32_, else empty
  HostBuffer master_;    // slice_.count x F32: fp32 master of this rank's slice; element j
                         // is global flat element slice_.offset + j
  // CUDA module: params, grads and master on the device (grads_ is then left empty, and
  // params_ / master_ are staging copies for initial values and checkpoints).
  std::unique_ptr<engine::DeviceStore> dev_;
  std::vector<TensorView> param_views_, grad_views_;  // what the module was bound to

  // ---- optimizer, scaler, scheduler ----
  std::unique_ptr<optim::Optimizer> optimizer_;  // state sized for slice_.count elements
  std::unique_ptr<sched::LrScheduler> scheduler_;  // null: constant lr from the optimizer config
  precision::LossScaler scaler_;                 // fp16 dynamic/static; scale 1 otherwise

  // ---- counters (DeepSpeed semantics) ----
  std::int64_t global_steps_ = 0;    // boundaries reached (skipped ones included)
  std::int64_t global_samples_ = 0;  // += train_batch_size per boundary
  std::int64_t micro_steps_ = 0;     // step() calls
  std::int64_t skipped_steps_ = 0;   // boundaries whose update was skipped (overflow / NaN)
  std::int64_t applied_steps_ = 0;   // optimizer updates applied (the optimizer's `step` t)
  double global_grad_norm_ = 0.0;    // last boundary: unscaled, pre-clip; -1 if inf/NaN
  bool last_step_applied_ = false;

  // ---- per accumulation cycle ----
  std::vector<Bucket> buckets_;                  // buckets_[0] holds the END of the flat space
  std::vector<std::vector<std::size_t>> param_buckets_;  // param -> buckets it intersects
  std::vector<std::uint8_t> param_ready_;        // grad_ready seen this backward
  std::size_t next_launch_ = 0;                  // buckets launch strictly in index order
  std::size_t next_finish_ = 0;                  // stage 2: ... and finish in index order
  bool reducing_this_backward_ = false;
  bool cycle_reduced_ = false;                   // stage 0/1: this cycle's grads were reduced
  double backward_scale_ = 1.0;                  // the loss scale the cycle's backwards used
  double cycle_loss_sum_ = 0.0;                  // sum of forward losses in this cycle
  int cycle_losses_ = 0;
  bool cycle_loss_nonfinite_ = false;
  double pre_factor_ = 1.0, post_factor_ = 1.0;  // gradient averaging (prescale / predivide)

  // ---- reporting ----
  Timers timers_;
  Stopwatch step_clock_;           // since the last boundary (for samples/s)
  double last_loss_ = 0.0;
  double last_lr_ = 0.0;           // lr of the last boundary (applied, or would have been)
  std::unique_ptr<engine::CsvMonitor> csv_;
};

// DeepSpeed's (engine, optimizer, lr_scheduler) tuple, minus the data loader.
struct InitResult {
  std::unique_ptr<Engine> engine;
  optim::Optimizer* optimizer = nullptr;
  sched::LrScheduler* lr_scheduler = nullptr;
};

// config: a path to ds_config.json or the JSON text itself. comm: the data-parallel group;
// nullptr initializes MPI (ds::init_distributed) and uses COMM_WORLD. Batch sizes are
// resolved for comm->size(); config errors surface unchanged as ds::Error.
// device_comm: see Engine's constructor (NCCL, for a CUDA module on more than one rank;
// nullptr with comm == nullptr: initialize makes it when the module is a CUDA one).
InitResult initialize(const std::string& config, Module& module, std::shared_ptr<Communicator> comm = nullptr,
                      std::shared_ptr<Communicator> device_comm = nullptr);
InitResult initialize(config::DsConfig config, Module& module, std::shared_ptr<Communicator> comm = nullptr,
                      std::shared_ptr<Communicator> device_comm = nullptr);

}  // namespace ds
