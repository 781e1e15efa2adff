// The training engine (docs/dev/engine.md), following DeepSpeed's runtime/engine.py and
// runtime/zero/stage_1_and_2.py. The engine orchestrates; the flat storage and everything
// that depends on where it lives is the ParamStore (param_store.h), the data-parallel
// gradient reduction the GradReducer (grad_reducer.h).
#include "ds/engine/engine.h"

#include <algorithm>
#include <cmath>

#include "async_save.h"
#include "ds/config/parse.h"
#include "ds/config/validate.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/engine/flops_profiler.h"
#include "ds/engine/monitor.h"
#include "ds/mpi/comms_logger.h"
#include "ds/optim/optimizer.h"
#include "ds/sched/lr_scheduler.h"
#include "grad_reducer.h"
#include "param_store.h"
#include "zero3_fetcher.h"
#include "zero3_store.h"

namespace ds {

// As DeepSpeed's DeepSpeedEngine.__init__: configure, then each piece in the order the next
// one needs it (storage before the optimizer that steps it, values before binding them).
Engine::Engine(config::DsConfig cfg, Module& module, std::shared_ptr<Communicator> comm,
               std::shared_ptr<void> dist_keepalive, std::shared_ptr<Communicator> device_comm,
               PipelineStage pipeline)
    : cfg_(std::move(cfg)), module_(&module), comm_(std::move(comm)), dist_keepalive_(std::move(dist_keepalive)),
      device_comm_(std::move(device_comm)), pipeline_(std::move(pipeline)), device_(module.device()) {
  DS_CHECK(comm_ != nullptr, "ds::Engine needs a communicator");
  CommCallerScope caller("initialize");  // comms_logger.debug's name for the collectives below
  rank_ = comm_->rank();
  world_ = comm_->size();
  configure_precision_and_comms();
  const engine::StoreOptions so = configure_storage();
  configure_optimizer(so);
  init_and_bind_parameters();
  make_scaler();
  const config::OptimizerConfig ocfg = cfg_.optimizer.value_or(config::OptimizerConfig{});
  scheduler_ = sched::make_scheduler(cfg_.scheduler.value_or(config::SchedulerConfig{}), ocfg.lr, ocfg.betas);
  configure_grad_sync(so);
  async_save_ = std::make_unique<engine::AsyncSave>();
  const bool reports = rank_ == 0 && pipeline_.stage == 0;  // one writer per job
  monitors_ = std::make_unique<engine::Monitors>(cfg_, reports);
  if (cfg_.flops_profiler.enabled)
    flops_profiler_ = std::make_unique<engine::FlopsProfiler>(cfg_.flops_profiler, *module_, reports, world_,
                                                              cfg_.train_micro_batch_size_per_gpu);
  DS_INFO("dstrain engine: " << (device_ == Device::Cuda ? "CUDA device, " : "") << map_.params.size()
          << " parameter tensors, " << map_.total_numel << " parameters, ZeRO stage " << map_.stage << ", "
          << dtype_name(wdtype_) << " working / " << dtype_name(comm_dtype_) << " communication, world size "
          << world_ << ", micro batch " << cfg_.train_micro_batch_size_per_gpu << " x gas "
          << cfg_.gradient_accumulation_steps << " -> train batch " << cfg_.train_batch_size
          << "; model states per rank: " << memory_report().to_string());
  step_clock_.reset();
}

// The config for this world size, the dtypes it names, and the communicators' settings.
void Engine::configure_precision_and_comms() {
  if (!pipeline_.pipe) config::refuse_pipeline_training(cfg_.pipeline, cfg_.source);  // before the batch arithmetic
  config::resolve_batch_sizes(cfg_, world_);
  // "auto" values the caller has not filled (the train app fills them from its flags first):
  // filled from what the config knows, or refused (a learning rate, a precision).
  for (const std::string& line : config::fill_auto_values(cfg_, {})) DS_INFO("config: " << line);
  config::validate(cfg_, world_);  // every rule across keys, for the world it trains on
  wdtype_ = cfg_.fp16.enabled ? DType::F16 : cfg_.bf16.enabled ? DType::BF16 : DType::F32;
  comm_dtype_ = cfg_.communication_data_type ? parse_dtype(*cfg_.communication_data_type) : wdtype_;
  accum_fp32_ = cfg_.data_types.grad_accum_dtype == "fp32" && wdtype_ != DType::F32;
  // A peer that never arrives (stopped, dead) ends the job after this long instead of hanging it.
  comm_->set_timeout(cfg_.comms_config.timeout);
  if (device_comm_) device_comm_->set_timeout(cfg_.comms_config.timeout);
  comm_->set_paths({cfg_.communication.shared_memory, cfg_.communication.progress_thread});
  if (device_ == Device::Cuda) {
    check_device_limits();
    if (device_comm_) device_comm_->set_compute_stream(module_->device_stream());
  }
  if (cfg_.comms_logger.enabled) enable_comms_logger();  // off: the backends as they are, nothing timed
}

// The flat layout of the module's parameters and the store that holds them, allocated once.
engine::StoreOptions Engine::configure_storage() {
  const bool cuda = device_ == Device::Cuda;
  const auto infos = module_->parameters();
  DS_CHECK(!infos.empty(), "the module has no parameters: nothing to train");
  map_ = engine::make_partition_map(infos, world_, cfg_.zero_optimization.stage, module_->parameter_groups(),
                                    dtype_size(wdtype_));
  DS_CHECK(map_.total_numel > 0, "the module's parameters have zero elements in total");
  check_same_model_on_all_ranks(infos);
  engine::StoreOptions so;
  so.wdtype = wdtype_;
  so.accum_fp32 = accum_fp32_;
  so.release_grads = map_.stage == 2 && world_ > 1;
  // ZeRO-Offload on the GPU path: master and optimizer state in host memory, the CPU kernels.
  const auto& off = cfg_.zero_optimization.offload_optimizer;
  so.offload_optimizer = cuda && off.device == "cpu";
  so.sub_group = std::size_t(std::max<std::int64_t>(0, cfg_.zero_optimization.sub_group_size));
  so.pin_memory = off.pin_memory;
  if (map_.stage >= 1 && world_ > 1) {  // allgather_bucket_size elements per gather (NCCL: the whole slice)
    const std::size_t per_rank = std::size_t(std::max<std::int64_t>(1, cfg_.zero_optimization.allgather_bucket_size / world_));
    so.gather_chunk = cuda ? map_.partition_numel : std::min(per_rank, map_.partition_numel);
  }
  so.nvme = nvme_options();
  store_ = engine::ParamStore::make(map_, rank_, so, *module_);
  return so;
}

// The optimizer's state sized for this rank's step range (or, NVMe offload, in swap files).
void Engine::configure_optimizer(const engine::StoreOptions& so) {
  const config::OptimizerConfig ocfg = cfg_.optimizer.value_or(config::OptimizerConfig{});
  const bool device_kernels = device_ == Device::Cuda && !so.offload_optimizer;
  optimizer_ = optim::make_optimizer(ocfg, device_kernels ? optim::Kernel::Cuda : optim::Kernel::Cpu);
  store_->attach_optimizer(*optimizer_);
}

// Initial values: the module's init on fp32 scratch, rank 0's values broadcast; then the
// module is bound to the store's parameter and gradient views.
void Engine::init_and_bind_parameters() {
  if (map_.stage == 3) {
    init_stage3_by_groups();
  } else {
    HostBuffer scratch(map_.padded_numel, DType::F32);
    float* s = scratch.as<float>();
    std::vector<std::span<float>> spans;
    spans.reserve(map_.params.size());
    for (const auto& p : map_.params) spans.emplace_back(s + p.offset, p.numel);
    module_->init_parameters(spans, cfg_.seed.value_or(42));
    if (world_ > 1) comm_->broadcast(TensorView{s, map_.padded_numel, DType::F32}, 0);
    store_->set_initial(s);
  }
  std::vector<TensorView> param_views, grad_views;
  for (const auto& p : map_.params) {
    param_views.push_back(store_->params(p.offset, p.numel));
    grad_views.push_back(store_->grads(p.offset, p.numel));
  }
  module_->bind(param_views, grad_views);
  store_->views_bound();
}

// Where gradients go: stage 3's GroupFetcher (gathers and reduce-scatters by group), or the
// GradReducer's buckets below it.
void Engine::configure_grad_sync(const engine::StoreOptions& so) {
  const bool cuda = device_ == Device::Cuda;
  grad_comm_ = cuda && device_comm_ ? device_comm_.get() : comm_.get();
  if (map_.stage == 3) {
    auto fetcher = std::make_unique<engine::GroupFetcher>(
        map_, static_cast<engine::Zero3Store&>(*store_), *grad_comm_, fetch_options(), timers_);
    fetcher_ = fetcher.get();
    module_->set_group_hooks(fetcher_);
    sync_ = std::move(fetcher);
    return;
  }
  engine::ReducerOptions ro;
  ro.bucket_size = cfg_.zero_optimization.reduce_bucket_size;
  ro.comm_dtype = comm_dtype_;
  ro.prescale_gradients = cfg_.prescale_gradients;
  ro.predivide_factor = cfg_.gradient_predivide_factor;
  ro.accum_fp32 = accum_fp32_;
  ro.release_grads = so.release_grads;
  // ZeRO-2 on a device: released gradient chunks have no memory behind them, so the reducer
  // maps each group's chunks as backward acquires the group (GroupHooks, as stage 3's fetcher).
  const bool map_in_backward = cuda && so.release_grads;
  if (map_in_backward) ro.groups = module_->parameter_groups();
  auto reducer = std::make_unique<engine::GradReducer>(map_, *store_, *grad_comm_, ro, timers_);
  if (map_in_backward && !ro.groups.empty()) module_->set_group_hooks(reducer.get());
  sync_ = std::move(reducer);
}

// Stage 3: rank 0 runs the init and the values go out one group at a time, so no other rank
// ever holds the whole model (each keeps its pieces). A module that can initialise a range of
// its parameters (Module::init_parameter_range) is initialised a group at a time, so rank 0
// does not hold it whole either; otherwise rank 0 initialises it whole once.
void Engine::init_stage3_by_groups() {
  auto& st = static_cast<engine::Zero3Store&>(*store_);
  const std::uint64_t seed = cfg_.seed.value_or(42);
  HostBuffer group(map_.largest_group(), DType::F32);
  HostBuffer whole;  // rank 0, when the module initialises only the whole model
  auto init_group = [&](std::size_t g) {  // into `group` (zeroed first: its padding must read 0)
    const auto& fg = map_.groups[g];
    float* base = group.as<float>();
    std::fill_n(base, fg.padded, 0.0f);
    std::vector<std::span<float>> spans;
    for (std::size_t i = fg.first_param; i < fg.first_param + fg.param_count; ++i)
      spans.emplace_back(base + (map_.params[i].offset - fg.offset), map_.params[i].numel);
    return module_->init_parameter_range(fg.first_param, spans, seed);
  };
  std::int32_t ranged = 0;
  if (rank_ == 0) {
    ranged = init_group(0) ? 1 : 0;
    if (!ranged) {
      whole = HostBuffer(map_.padded_numel, DType::F32);
      std::vector<std::span<float>> spans;
      for (const auto& p : map_.params) spans.emplace_back(whole.as<float>() + p.offset, p.numel);
      module_->init_parameters(spans, seed);
    }
  }
  if (world_ > 1) comm_->broadcast(TensorView{&ranged, 1, DType::I32}, 0);
  for (std::size_t g = 0; g < map_.groups.size(); ++g) {
    float* v = group.as<float>();
    if (rank_ == 0 && !ranged) v = whole.as<float>() + map_.groups[g].offset;
    else if (rank_ == 0 && g > 0) init_group(g);
    if (world_ > 1) comm_->broadcast(TensorView{v, map_.groups[g].padded, DType::F32}, 0);
    st.set_initial_group(g, v);
  }
}

Engine::~Engine() {
  // The last boundary's outcome: its counters and progress line (a device step's copy arrived
  // long ago). An error of it (the scale stuck at its minimum) can only be logged here.
  try {
    resolve_step();
  } catch (const std::exception& e) {
    DS_WARN("the last optimizer step's outcome: " << e.what());
  }
  // ZeRO-2 on a device set the reducer as the module's hooks: it goes with this engine, so the
  // module must not call it from a later engine's passes.
  if (device_ == Device::Cuda && map_.stage == 2 && world_ > 1) module_->set_group_hooks(nullptr);
}

// ----------------------------------------------------------------------------------------
// forward / backward / step
// ----------------------------------------------------------------------------------------

namespace {
// Brackets a module call with the sync's begin/end (stage 3 gathers around it), also when it throws.
template <class F>
auto bracketed(engine::GradSync& sync, F&& call) {
  sync.begin_forward();
  struct End {
    engine::GradSync& s;
    bool ok = false;
    ~End() {
      if (!ok) {
        try { s.end_forward(); } catch (...) {}
      }
    }
  } end{sync};
  auto r = call();
  end.ok = true;
  sync.end_forward();
  return r;
}
}  // namespace

float Engine::evaluate(const Batch& batch) {
  CommCallerScope caller("evaluate");
  return bracketed(*sync_, [&] { return module_->evaluate(batch); });
}

float Engine::forward(const Batch& batch) {
  CommCallerScope caller("forward");
  timers_.start("forward");
  if (flops_profiler_) flops_profiler_->begin(engine::FlopsPhase::Forward, global_steps_);
  const float loss = bracketed(*sync_, [&] { return module_->forward(batch); });
  if (flops_profiler_) flops_profiler_->end(engine::FlopsPhase::Forward);
  timers_.stop("forward");
  if (std::isfinite(loss)) {
    cycle_loss_sum_ += loss;
  } else {
    cycle_loss_nonfinite_ = true;
  }
  cycle_losses_++;
  last_loss_ = loss;
  return loss;
}

float Engine::backward(float loss) {
  CommCallerScope caller("backward");
  timers_.start("backward");
  if (flops_profiler_) flops_profiler_->begin(engine::FlopsPhase::Backward, global_steps_);
  const double gas = double(cfg_.gradient_accumulation_steps);
  // A dynamic fp16 scale may have changed at the last boundary: apply its outcome first.
  if (scaler_.dynamic()) resolve_step();
  backward_scale_ = scaler_.scale();
  // Gradients start reducing, bucket by bucket, as the module reports them final.
  sync_->begin_backward(is_gradient_accumulation_boundary());
  module_->backward(float(backward_scale_ / gas), [this](std::size_t i) { sync_->grad_ready(i); });
  timers_.stop("backward");
  sync_->end_backward();
  store_->after_backward();
  if (flops_profiler_) flops_profiler_->end(engine::FlopsPhase::Backward);
  return float(loss / gas);
}

void Engine::step() {
  CommCallerScope caller("step");
  if (is_gradient_accumulation_boundary()) {
    if (flops_profiler_) flops_profiler_->begin(engine::FlopsPhase::Step, global_steps_);
    boundary_step();
    if (flops_profiler_) flops_profiler_->end(engine::FlopsPhase::Step);  // the profiled step's end prints
  } else {
    // An unresolved boundary before this step keeps "not applied" as the last word.
    if (pending_.active) pending_.superseded = true;
    last_step_applied_ = false;
  }
  micro_steps_ += 1;
}

void Engine::boundary_step() {
  // 1. Finish the gradient reduction.
  timers_.start("reduce");
  sync_->finish();
  timers_.stop("reduce");
  // The previous boundary's outcome first: DeepSpeed steps the scheduler only after an applied
  // step, so this step's lr depends on it, as does the optimizer's step count.
  resolve_step();

  timers_.start("step");
  // 2. What the decision needs from the host: the scale backward used, the averaging post
  //    factor, clipping, and the cycle's loss (a non-finite one skips the step on every rank).
  precision::StepInputs in;
  in.used_scale = backward_scale_;
  in.post = sync_->post_factor();
  in.clip = cfg_.gradient_clipping;
  in.world = world_;
  in.partitioned = store_->partitioned() ? 1 : 0;
  in.grads_can_skip = (wdtype_ != DType::BF16 || cfg_.bf16.check_grad_overflow) ? 1 : 0;
  in.loss_nonfinite = cycle_loss_nonfinite_ ? 1 : 0;
  in.loss_mean = cycle_losses_ > 0 ? cycle_loss_sum_ / cycle_losses_ : 0.0;
  const double lr = scheduler_->lr();
  last_lr_ = lr;
  optim::StepContext ctx;
  ctx.lr = lr;
  ctx.step = applied_steps_ + 1;  // the step count if this one is applied
  ctx.betas = scheduler_->betas();

  pending_ = PendingStep{};
  pending_.step = global_steps_ + 1;
  if (store_->async_step() && !test_switches_.synchronous_device_steps) {
    // 3a. On the device, without waiting: statistics, their all-reduce, the decision, the
    //     optimizer (a no-op there when skipped), then (ZeRO 1/2) the gather -- of unchanged
    //     slices after a skip, which is harmless.
    Communicator* across = world_ > 1 ? grad_comm_ : nullptr;
    store_->launch_step(*optimizer_, ctx, in, across, store_->partitioned() ? across : nullptr);
    sync_->params_changed();
    pending_.from_store = true;
    pending_.active = true;
  } else {
    // 3b. Overflow and norm: one fused pass over this rank's gradients (sum of squares +
    //     inf/NaN), agreed across ranks together with the loss in ONE small all-reduce, then
    //     the scaler sees the boundary (it throws when stuck at the minimum scale) before the
    //     optimizer, as always.
    const precision::StepDecision d = host_step_decision(in);
    pending_.decision = d;
    pending_.active = true;
    const bool now = !test_switches_.defer_host_step_outcomes;
    if (now) {
      pending_.active = false;
      apply_step_outcome(d);
    }
    if (!d.skip) {
      // 4. Optimizer (grad_scale: 1/loss_scale x averaging x clip coefficient), then (ZeRO)
      //    every rank gets every updated slice.
      ctx.grad_scale = d.grad_scale;
      store_->optimizer_step(*optimizer_, ctx);
      if (store_->partitioned() && world_ > 1) store_->gather_params(*grad_comm_);
      sync_->params_changed();
    }
  }
  store_->zero_grads();
  global_steps_ += 1;
  global_samples_ += cfg_.train_batch_size;
  timers_.stop("step");

  pending_.step_ms = step_clock_.elapsed_ms();
  step_clock_.reset();
  if (!pending_.active) report_progress(pending_.decision.skip != 0, pending_.decision.mean_loss, pending_.step_ms);
  reset_cycle();
}

precision::StepDecision Engine::host_step_decision(const precision::StepInputs& in) {
  const precision::GradStats st = store_->grad_stats();
  const int own_inf = st.has_inf_or_nan ? 1 : 0;
  precision::StepStats red = precision::pack_step_stats(st.sum_of_squares, own_inf, in);
  if (world_ > 1) comm_->all_reduce(TensorView{red.v, 4, DType::F64}, ReduceOp::Sum);
  if (!pipeline_.pipe) return precision::decide_step(red, st.sum_of_squares, own_inf, in);
  // A pipeline stage: its own sum of squares (as decide_step takes it) summed over the pipe's
  // stages with the flags and the loss (only the last stage has one), then decided as
  // partitioned statistics -- the same decision on every rank of the job.
  if (!in.partitioned) red.v[0] = own_inf ? 0.0 : st.sum_of_squares;
  pipeline_.pipe->all_reduce(TensorView{red.v, 4, DType::F64}, ReduceOp::Sum);
  precision::StepInputs across = in;
  across.partitioned = 1;
  return precision::decide_step(red, st.sum_of_squares, own_inf, across);
}

void Engine::resolve_step() const {
  // Engines are never created const, so the accessors may apply the outcome they report.
  if (pending_.active) const_cast<Engine*>(this)->apply_pending_step();
}

void Engine::apply_pending_step() {
  pending_.active = false;  // first: an outcome that throws is not applied twice
  const precision::StepDecision d = pending_.from_store ? store_->finish_step() : pending_.decision;
  pending_.decision = d;
  apply_step_outcome(d);
  report_progress(d.skip != 0, d.mean_loss, pending_.step_ms);
}

void Engine::apply_step_outcome(const precision::StepDecision& d) {
  global_grad_norm_ = d.grad_norm;
  const bool overflow = d.skip != 0;
  // The loss scaler sees every boundary; other dtypes warn about a skipped step.
  if (wdtype_ == DType::F16) {
    scaler_.update(overflow);  // throws when stuck at the minimum scale; logs OVERFLOW lines
  } else if (overflow) {
    DS_WARN("non-finite " << (d.loss_bad ? "loss" : "gradients") << " at step " << pending_.step
            << ": skipping the optimizer step (skipped steps so far: " << skipped_steps_ + 1 << ")");
  }
  if (overflow) {
    skipped_steps_ += 1;
    last_step_applied_ = false;
  } else {
    applied_steps_ += 1;
    scheduler_->step();  // DeepSpeed does not step the scheduler on a skipped step
    last_step_applied_ = !pending_.superseded;
  }
}

void Engine::reset_cycle() {
  cycle_loss_sum_ = 0;
  cycle_losses_ = 0;
  cycle_loss_nonfinite_ = false;
}

}  // namespace ds
