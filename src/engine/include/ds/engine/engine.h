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
#include "ds/precision/step_decision.h"

namespace ds::optim { class Optimizer; struct Segment; }
namespace ds::sched { class LrScheduler; }

namespace ds {

class CommsLog;
namespace engine { class FlopsProfiler; class Monitors; class ParamStore; class GradSync; class GroupFetcher; struct AsyncSave; struct FetchOptions; struct NvmeOptions; struct StoreOptions; }
namespace io { struct CheckpointContent; struct ShardRange; }

// Switches for the engine's own tests, per engine (docs/dev/engine.md "The boundary step");
// training leaves them off.
struct EngineTestSwitches {
  // The host store's boundary outcome is applied the way a device store's is -- later, at the
  // first point that depends on it -- so the CPU tests run the lazy resolution the GPU path uses.
  bool defer_host_step_outcomes = false;
  // A device store takes the synchronous boundary step even where it has the asynchronous one
  // (the CUDA tests compare the two).
  bool synchronous_device_steps = false;
};

// The stage side of a pipeline (ds/pipe/pipe_engine.h builds a stage's engine with it): the
// engine's communicator is the stage's data-parallel group, `pipe` this rank's pipe (one rank
// per stage, in stage order). The boundary step's statistics are summed over the pipe too, so
// every stage takes one skip decision and clips by the norm over all stages; the monitors and
// the flops profiler run on stage 0's first rank only. Checkpoints are the whole model's,
// written and read by every rank of the job (`world`): the stage's parameters are a run of
// `model_params` starting `dense_offset` elements into the model, and each rank writes its
// own share of the master and optimizer state there (the layout a ZeRO-3 checkpoint has), so
// any grid, and a data-parallel run, loads it.
struct PipelineStage {
  std::shared_ptr<Communicator> pipe;  // null: not a pipeline stage
  int stage = 0;
  int stages = 1;
  std::shared_ptr<Communicator> world;  // every rank of the job
  std::vector<ParamInfo> model_params;  // the whole model's parameters, in order
  std::size_t dense_offset = 0;         // elements of model_params before the stage's first
};

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
  // gradients and ZeRO's parameter gathers go over device_comm (NCCL, or StagedComm where
  // ranks share a GPU: ds/mpi/device_comm.h), required when comm has more than one rank.
  // `pipeline`: set only by the pipeline engine (a stage of a pipe); without it a config with
  // pipeline.stages > 1 is refused.
  Engine(config::DsConfig cfg, Module& module, std::shared_ptr<Communicator> comm,
         std::shared_ptr<void> dist_keepalive = nullptr, std::shared_ptr<Communicator> device_comm = nullptr,
         PipelineStage pipeline = {});
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
  // checks overflow, clips, updates, steps the scheduler (see docs/dev/engine.md). On a CUDA
  // device the boundary step is enqueued without waiting for the GPU; its outcome (skipped or
  // applied, grad norm, loss scale, the scheduler's step, the progress line) is applied when
  // something depends on it: the next boundary, the next backward (fp16 dynamic scale), an
  // accessor below that reads it, a checkpoint. Errors of that outcome (the loss scale stuck
  // at its minimum) surface there.
  void step();
  // Validation loss (no gradients, no counters).
  float evaluate(const Batch& batch);
  // The validation loss the caller computed (its mean over ranks and batches) goes to the
  // enabled monitors at global_samples() (tensorboard: Train/Samples/eval_loss); rank 0
  // writes, the other ranks ignore it. Not collective.
  void log_eval_loss(double loss);

  // --- checkpoints (defined in engine_checkpoint.cpp) ---
  void save_checkpoint(const std::string& save_dir, std::optional<std::string> tag = std::nullopt,
                       const io::StateValue& client_state = io::StateValue(), bool save_latest = true);
  std::optional<std::pair<std::string, io::StateValue>> load_checkpoint(
      const std::string& load_dir, std::optional<std::string> tag = std::nullopt,
      const LoadOptions& options = LoadOptions());
  // Collective. With checkpoint.async_save, waits for the background writer of the last
  // save and commits it (docs/user/checkpoints.md); returns the committed checkpoint
  // directory, or "" when no async save was pending. Call it on every rank before the job
  // ends, or the last async save stays uncommitted.
  std::string wait_for_checkpoint();
  // Tests only: set before the first step (see EngineTestSwitches).
  void set_test_switches(const EngineTestSwitches& switches) { test_switches_ = switches; }

  // Collective. DeepSpeed's save_16bit_model: the current weights in the working dtype (fp32
  // when training in fp32), consolidated into <save_dir>/<filename>, a safetensors file that
  // rank 0 writes (via a temporary name, renamed when complete) with the parameters' own
  // names and shapes. At stage 3 only with
  // zero_optimization.stage3_gather_16bit_weights_on_model_save (otherwise a warning and
  // false, as DeepSpeed), gathering one parameter group at a time. ds::Error on every rank
  // when rank 0 cannot write it.
  bool save_16bit_model(const std::string& save_dir, const std::string& filename = "model.safetensors");

  // --- counters and state (DeepSpeed's names) ---
  std::int64_t global_steps() const { return global_steps_; }
  std::int64_t global_samples() const { return global_samples_; }
  std::int64_t micro_steps() const { return micro_steps_; }
  std::int64_t skipped_steps() const { resolve_step(); return skipped_steps_; }
  // DeepSpeed: (micro_steps + 1) % gas == 0, evaluated before step() increments micro_steps.
  bool is_gradient_accumulation_boundary() const {
    return (micro_steps_ + 1) % cfg_.gradient_accumulation_steps == 0;
  }
  // True when the last step() applied an optimizer update (boundary and no overflow).
  bool was_step_applied() const { resolve_step(); return last_step_applied_; }
  double get_lr() const;                                   // lr the NEXT optimizer step applies
  double loss_scale() const { resolve_step(); return scaler_.scale(); }  // scale the next backward uses
  double get_global_grad_norm() const { resolve_step(); return global_grad_norm_; }  // last boundary, unscaled, pre-clip
  std::int64_t train_batch_size() const { return cfg_.train_batch_size; }
  std::int64_t train_micro_batch_size_per_gpu() const { return cfg_.train_micro_batch_size_per_gpu; }
  std::int64_t gradient_accumulation_steps() const { return cfg_.gradient_accumulation_steps; }
  const config::DsConfig& config() const { return cfg_; }
  Communicator& comm() const { return *comm_; }
  const PipelineStage& pipeline_stage() const { return pipeline_; }
  Device device() const { return device_; }  // where the flat storage and the step live
  std::shared_ptr<Communicator> comm_ptr() const { return comm_; }
  int zero_stage() const { return map_.stage; }
  DType working_dtype() const { return wdtype_; }
  DType communication_dtype() const { return comm_dtype_; }
  const engine::PartitionMap& partition_map() const { return map_; }
  Module& module() const { return *module_; }
  optim::Optimizer* optimizer() const { return optimizer_.get(); }
  // The scheduler and the scaler with the last boundary's outcome applied (a pointer kept from
  // initialize() sees the outcome only once something applied it, e.g. get_lr()).
  sched::LrScheduler* lr_scheduler() const { resolve_step(); return scheduler_.get(); }
  const precision::LossScaler& loss_scaler() const { resolve_step(); return scaler_; }

  // Bytes this rank really holds for model states (no activations). ZeRO-2 gradients are
  // measured (resident pages), see docs/dev/engine.md "Stage 2".
  engine::ModelStateBytes memory_report() const;
  // Gradient storage residency, measured now with mincore (ZeRO-2 releases the pages of
  // reduced buckets; other stages keep the whole buffer resident). On a CUDA device: the
  // mapped chunks of the ZeRO-2 gradient buffer (all zero at other stages, one allocation).
  struct GradientMemory {
    std::size_t reserved = 0;     // address space of the full-size bound gradient buffer
    std::size_t resident = 0;     // bytes of its pages resident now
    std::size_t partition = 0;    // pages kept resident for good (ZeRO-2: this rank's slice)
    std::size_t peak_resident = 0;  // most bytes resident at a release during backward
  };
  GradientMemory gradient_memory() const;

  // The consolidated model for export: an fp32 copy of the current working parameters (flat,
  // unpadded, in Module::parameters() order; at stages 0-2 every rank holds them whole). At
  // stage 3 this is collective: every rank's partition is gathered.
  std::vector<float> gather_params_fp32() const;
  // Accumulated ms per phase ("forward", "backward", "reduce", "step"); reset after each
  // progress line when wall_clock_breakdown is on.
  const Timers& timers() const { return timers_; }
  // comms_logger: this rank's collectives so far in DeepSpeed's log_summary() table ("" when
  // comms_logger is off or none ran). Not collective; the train app prints rank 0's at the end.
  std::string comms_summary() const;

 private:
  // Collective: every rank must hold the same parameter names and shapes (else ds::Error on all ranks).
  void check_same_model_on_all_ranks(const std::vector<ParamInfo>& infos);
  void check_device_limits() const;  // the GPU path's limits (engine_init.cpp)
  // The constructor's steps, in its order (engine.cpp).
  void configure_precision_and_comms();
  void enable_comms_logger();  // wraps the communicators in recording ones (engine_init.cpp)
  engine::StoreOptions configure_storage();
  void configure_optimizer(const engine::StoreOptions& so);
  void init_and_bind_parameters();
  void configure_grad_sync(const engine::StoreOptions& so);
  void make_scaler();
  void init_stage3_by_groups();  // initial values at stage 3 (engine.cpp)
  engine::FetchOptions fetch_options() const;  // stage 3: the zero_optimization keys (engine_init.cpp)
  engine::NvmeOptions nvme_options() const;    // offload_* device nvme (engine_init.cpp)
  void boundary_step();
  precision::StepDecision host_step_decision(const precision::StepInputs& in);  // the synchronous path
  // Applies the launched boundary step's outcome if it is not applied yet (const: the
  // accessors call it; it waits for the device's event when the step ran there).
  void resolve_step() const;
  void apply_pending_step();
  void apply_step_outcome(const precision::StepDecision& d);  // counters, scaler, scheduler
  void report_progress(bool overflow, double loss, double step_ms);
  void reset_cycle();
  // Checkpoints (engine_checkpoint.cpp).
  io::CheckpointContent checkpoint_content(const io::StateValue& client_state, std::vector<std::vector<float>>& scratch);
  void place_in_whole_model(io::CheckpointContent& c) const;  // a pipeline stage's checkpoint
  // The checkpoint's communicator and this rank in it: the stage's pipeline world, else comm_.
  Communicator& checkpoint_comm() const { return pipeline_.world ? *pipeline_.world : *comm_; }
  std::vector<io::ShardRange> stage3_ranges() const;
  void apply_engine_state(const io::StateValue& es, const LoadOptions& opt, bool load_opt);

  // ---- configuration ----
  config::DsConfig cfg_;                    // resolved (batch sizes filled for world_)
  Module* module_ = nullptr;
  std::shared_ptr<Communicator> comm_;      // data-parallel group (all ranks)
  std::shared_ptr<void> dist_keepalive_;    // the distributed context when initialize made it
  std::shared_ptr<Communicator> device_comm_;  // NCCL or staged group for a CUDA module's gradients (world > 1)
  Communicator* grad_comm_ = nullptr;       // where gradients and ZeRO gathers travel: device_comm_ or comm_
  std::shared_ptr<CommsLog> comms_log_;     // comms_logger.enabled: what comm_ and device_comm_ recorded
  PipelineStage pipeline_;                  // a pipeline stage's pipe (null pipe: none)
  Device device_ = Device::Cpu;             // module.device()
  int rank_ = 0, world_ = 1;
  DType wdtype_ = DType::F32;               // working params and grads: F32 | F16 | BF16
  DType comm_dtype_ = DType::F32;           // communication_data_type (default: wdtype_)
  bool accum_fp32_ = false;                 // data_types.grad_accum_dtype fp32 with a half wdtype_
  EngineTestSwitches test_switches_;      // off outside the engine's tests

  // ---- flat storage and gradient reduction (src/engine/src: param_store.h, grad_reducer.h) ----
  // map_: global layout. Parameter i occupies [map_.params[i].offset, +numel) of the flat
  // space. Elements [total_numel, padded_numel) are zero padding (ZeRO only).
  engine::PartitionMap map_;
  std::unique_ptr<engine::ParamStore> store_;     // params, grads, master, where they live
  // Gradient synchronisation: the GradReducer (stages 0-2: buckets, averaging, ZeRO-2 page
  // release) or, at stage 3, the GroupFetcher (also the module's GroupHooks: gathers and
  // releases parameter groups around their use); fetcher_ points at it then.
  std::unique_ptr<engine::GradSync> sync_;
  engine::GroupFetcher* fetcher_ = nullptr;

  // ---- optimizer, scaler, scheduler ----
  std::unique_ptr<optim::Optimizer> optimizer_;  // state sized for this rank's step range
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

  // ---- the last boundary step, launched but its outcome not applied yet ----
  // The host store's decision is known at once (and applied at once); a device store's
  // arrives through store_->finish_step(). Applied by resolve_step() (docs/dev/engine.md
  // "The boundary step").
  struct PendingStep {
    bool active = false;
    bool from_store = false;          // the decision comes from store_->finish_step()
    bool superseded = false;          // a later non-boundary step() said "not applied"
    precision::StepDecision decision;  // from_store false: the host's decision
    std::int64_t step = 0;            // its global step (1-based), for the warning
    double step_ms = 0.0;             // its time since the previous boundary
  };
  PendingStep pending_;

  // ---- per accumulation cycle ----
  double backward_scale_ = 1.0;                  // the loss scale the cycle's backwards used
  double cycle_loss_sum_ = 0.0;                  // sum of forward losses in this cycle
  int cycle_losses_ = 0;
  bool cycle_loss_nonfinite_ = false;

  // ---- reporting ----
  Timers timers_;
  Stopwatch step_clock_;           // since the last boundary (for samples/s)
  double last_loss_ = 0.0;
  double last_lr_ = 0.0;           // lr of the last boundary (applied, or would have been)
  std::unique_ptr<engine::Monitors> monitors_;  // csv_monitor, tensorboard (rank 0)
  std::unique_ptr<engine::FlopsProfiler> flops_profiler_;  // flops_profiler.enabled (prints on rank 0)

  // The asynchronous save in flight (checkpoint.async_save): its snapshot and writer thread.
  // Last, so it is joined before anything else goes.
  std::unique_ptr<engine::AsyncSave> async_save_;
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
// device_comm: see Engine's constructor (for a CUDA module on more than one rank; nullptr
// with comm == nullptr: initialize makes it when the module is a CUDA one, following
// communication.device_backend).
InitResult initialize(const std::string& config, Module& module, std::shared_ptr<Communicator> comm = nullptr,
                      std::shared_ptr<Communicator> device_comm = nullptr);
InitResult initialize(config::DsConfig config, Module& module, std::shared_ptr<Communicator> comm = nullptr,
                      std::shared_ptr<Communicator> device_comm = nullptr);

namespace io {
// engine.wait_for_checkpoint() as a free function (kept for code written against earlier
// releases, where it was declared in ds/io).
std::string wait_for_checkpoint(Engine& engine);
}  // namespace io

}  // namespace ds
