// The training engine (docs/dev/engine.md), following DeepSpeed's runtime/engine.py and
// runtime/zero/stage_1_and_2.py. The engine orchestrates; the flat storage and everything
// that depends on where it lives is the ParamStore (param_store.h), the data-parallel
// gradient reduction the GradReducer (grad_reducer.h).
#include "ds/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "async_save.h"
#include "ds/config/parse.h"
#include "ds/config/validate.h"
#include "ds/core/error.h"
#include "ds/core/hash.h"
#include "ds/core/log.h"
#include "ds/engine/monitor.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/init.h"
#include "ds/optim/optimizer.h"
#include "ds/sched/lr_scheduler.h"
#include "grad_reducer.h"
#include "param_store.h"

namespace ds {

InitResult initialize(config::DsConfig cfg, Module& module, std::shared_ptr<Communicator> comm,
                      std::shared_ptr<Communicator> device_comm) {
  std::shared_ptr<void> keepalive;
  if (!comm) {
    auto ctx = std::make_shared<DistributedContext>(init_distributed());
    comm = ctx->comm;
    if (!device_comm && module.device() == Device::Cuda && ctx->world_size > 1)
      device_comm = make_communicator(*ctx, "nccl");
    keepalive = ctx;
  }
  InitResult r;
  r.engine = std::make_unique<Engine>(std::move(cfg), module, std::move(comm), std::move(keepalive),
                                      std::move(device_comm));
  r.optimizer = r.engine->optimizer();
  r.lr_scheduler = r.engine->lr_scheduler();
  return r;
}

InitResult initialize(const std::string& config, Module& module, std::shared_ptr<Communicator> comm,
                      std::shared_ptr<Communicator> device_comm) {
  std::vector<std::string> warnings;
  return initialize(config::load_config(config, &warnings), module, std::move(comm), std::move(device_comm));
}

Engine::Engine(config::DsConfig cfg, Module& module, std::shared_ptr<Communicator> comm,
               std::shared_ptr<void> dist_keepalive, std::shared_ptr<Communicator> device_comm)
    : cfg_(std::move(cfg)), module_(&module), comm_(std::move(comm)), dist_keepalive_(std::move(dist_keepalive)),
      device_comm_(std::move(device_comm)), device_(module.device()) {
  DS_CHECK(comm_ != nullptr, "ds::Engine needs a communicator");
  rank_ = comm_->rank();
  world_ = comm_->size();
  config::resolve_batch_sizes(cfg_, world_);
  config::validate(cfg_, world_);  // every rule across keys, for the world it trains on
  wdtype_ = cfg_.fp16.enabled ? DType::F16 : cfg_.bf16.enabled ? DType::BF16 : DType::F32;
  comm_dtype_ = cfg_.communication_data_type ? parse_dtype(*cfg_.communication_data_type) : wdtype_;
  accum_fp32_ = cfg_.data_types.grad_accum_dtype == "fp32" && wdtype_ != DType::F32;
  // A peer that never arrives (stopped, dead) ends the job after this long instead of hanging it.
  comm_->set_timeout(cfg_.comms_config.timeout);
  if (device_comm_) device_comm_->set_timeout(cfg_.comms_config.timeout);
  comm_->set_paths({cfg_.communication.shared_memory, cfg_.communication.progress_thread});
  const bool cuda = device_ == Device::Cuda;
  if (cuda) {
    // The GPU path (docs/dev/gpu.md) offers ZeRO stages 0 and 1: stage 2's gradient partitioning
    // releases host pages of the gradient buffer (PagedBuffer), which device memory has not.
    DS_CHECK(cfg_.zero_optimization.stage <= 1,
             cfg_.source << ": zero_optimization.stage " << cfg_.zero_optimization.stage
                         << " with a model on a CUDA device: the GPU path supports stages 0 and 1; set stage 0 or 1");
    DS_CHECK(comm_dtype_ == wdtype_,
             cfg_.source << ": communication_data_type " << dtype_name(comm_dtype_) << " differs from the working dtype "
                         << dtype_name(wdtype_) << "; the GPU path reduces gradients in the working dtype (remove the key)");
    DS_CHECK(world_ == 1 || (device_comm_ && device_comm_->size() == world_),
             "the module runs on a CUDA device and the job has " << world_ << " ranks: gradients need an NCCL "
             "communicator of the same ranks (ds::initialize(cfg, model, comm, make_communicator(ctx, \"nccl\")))");
    DS_CHECK(!accum_fp32_,
             cfg_.source << ": data_types.grad_accum_dtype fp32 with the " << dtype_name(wdtype_)
                         << " working dtype: the GPU path accumulates gradients in the working dtype; remove the key "
                            "or set it to " << dtype_name(wdtype_));
    if (device_comm_) device_comm_->set_compute_stream(module_->device_stream());
  }

  // ---- layout and storage, allocated once ----
  const auto infos = module_->parameters();
  DS_CHECK(!infos.empty(), "the module has no parameters: nothing to train");
  map_ = engine::make_partition_map(infos, world_, cfg_.zero_optimization.stage);
  DS_CHECK(map_.total_numel > 0, "the module's parameters have zero elements in total");
  check_same_model_on_all_ranks(infos);
  engine::StoreOptions so;
  so.wdtype = wdtype_;
  so.accum_fp32 = accum_fp32_;
  so.release_grads = map_.stage == 2 && world_ > 1;
  if (map_.stage >= 1 && world_ > 1) {  // allgather_bucket_size elements per gather (NCCL: the whole slice)
    const std::size_t per_rank = std::size_t(std::max<std::int64_t>(1, cfg_.zero_optimization.allgather_bucket_size / world_));
    so.gather_chunk = cuda ? map_.partition_numel : std::min(per_rank, map_.partition_numel);
  }
  store_ = engine::ParamStore::make(map_, rank_, so, *module_);

  // ---- initial values: module init on fp32 scratch, rank 0's values broadcast ----
  {
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

  // ---- optimizer, scaler, scheduler, reducer ----
  const config::OptimizerConfig ocfg = cfg_.optimizer.value_or(config::OptimizerConfig{});
  optimizer_ = optim::make_optimizer(ocfg, cuda ? optim::Kernel::Cuda : optim::Kernel::Cpu);
  optimizer_->init_state(store_->step_count());
  make_scaler();
  scheduler_ = sched::make_scheduler(cfg_.scheduler.value_or(config::SchedulerConfig{}), ocfg.lr, ocfg.betas);
  engine::ReducerOptions ro;
  ro.bucket_size = cfg_.zero_optimization.reduce_bucket_size;
  ro.comm_dtype = comm_dtype_;
  ro.prescale_gradients = cfg_.prescale_gradients;
  ro.predivide_factor = cfg_.gradient_predivide_factor;
  ro.accum_fp32 = accum_fp32_;
  ro.release_grads = so.release_grads;
  reducer_ = std::make_unique<engine::GradReducer>(map_, *store_, cuda && device_comm_ ? *device_comm_ : *comm_, ro, timers_);
  async_save_ = std::make_unique<engine::AsyncSave>();

  if (cfg_.csv_monitor.enabled && rank_ == 0)
    csv_ = std::make_unique<engine::CsvMonitor>(cfg_.csv_monitor.output_path, cfg_.csv_monitor.job_name);

  DS_INFO("dstrain engine: " << (cuda ? "CUDA device, " : "") << map_.params.size() << " parameter tensors, " << map_.total_numel
          << " parameters, ZeRO stage " << map_.stage << ", " << dtype_name(wdtype_) << " working / "
          << dtype_name(comm_dtype_) << " communication, world size " << world_ << ", micro batch "
          << cfg_.train_micro_batch_size_per_gpu << " x gas " << cfg_.gradient_accumulation_steps
          << " -> train batch " << cfg_.train_batch_size << "; model states per rank: "
          << memory_report().to_string());
  step_clock_.reset();
}

Engine::~Engine() = default;

void Engine::make_scaler() {
  if (!cfg_.fp16.enabled) return;
  precision::LossScalerConfig sc;
  if (cfg_.fp16.loss_scale > 0) {
    sc = precision::LossScalerConfig::fixed(cfg_.fp16.loss_scale);
  } else {
    sc.dynamic = true;
    sc.initial_scale_power = cfg_.fp16.initial_scale_power;
    sc.window = cfg_.fp16.loss_scale_window;
    sc.hysteresis = cfg_.fp16.hysteresis;
    sc.consecutive_hysteresis = cfg_.fp16.consecutive_hysteresis;
    sc.min_scale = cfg_.fp16.min_loss_scale;
    sc.raise_at_min_scale = true;
  }
  scaler_ = precision::LossScaler(sc);
}

// Ranks built with different models would broadcast and reduce mismatched counts, which
// corrupts memory instead of failing. Compare a fingerprint of the names and shapes (and the
// element count) first; every rank sees the same min/max, so every rank throws together.
void Engine::check_same_model_on_all_ranks(const std::vector<ParamInfo>& infos) {
  if (world_ <= 1) return;
  std::uint64_t h = kFnv1aOffset;  // FNV-1a over "name:d0,d1,...;"
  auto mix = [&h](const void* p, std::size_t n) { h = fnv1a64(p, n, h); };
  for (const auto& p : infos) {
    mix(p.name.data(), p.name.size());
    for (std::int64_t d : p.shape) mix(&d, sizeof d);
    mix(";", 1);
  }
  std::int64_t lo[2] = {std::int64_t(h >> 1), std::int64_t(map_.total_numel)};
  std::int64_t hi[2] = {lo[0], lo[1]};
  comm_->all_reduce(TensorView{lo, 2, DType::I64}, ReduceOp::Min);
  comm_->all_reduce(TensorView{hi, 2, DType::I64}, ReduceOp::Max);
  DS_CHECK(lo[0] == hi[0] && lo[1] == hi[1],
           "the ranks hold different models: this rank has " << infos.size() << " parameter tensors, "
           << map_.total_numel << " elements; across ranks the element count ranges from " << lo[1]
           << " to " << hi[1] << " (names/shapes " << (lo[0] == hi[0] ? "agree" : "differ")
           << "). Start every rank with the same model and config.");
}

// ----------------------------------------------------------------------------------------
// forward / backward / step
// ----------------------------------------------------------------------------------------

float Engine::forward(const Batch& batch) {
  timers_.start("forward");
  const float loss = module_->forward(batch);
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
  timers_.start("backward");
  const double gas = double(cfg_.gradient_accumulation_steps);
  backward_scale_ = scaler_.scale();
  // Gradients start reducing, bucket by bucket, as the module reports them final.
  reducer_->begin_backward(is_gradient_accumulation_boundary());
  module_->backward(float(backward_scale_ / gas), [this](std::size_t i) { reducer_->grad_ready(i); });
  timers_.stop("backward");
  reducer_->end_backward();
  store_->after_backward();
  return float(loss / gas);
}

void Engine::step() {
  if (is_gradient_accumulation_boundary()) {
    boundary_step();
  } else {
    last_step_applied_ = false;
  }
  micro_steps_ += 1;
}

void Engine::boundary_step() {
  // 1. Finish the gradient reduction.
  timers_.start("reduce");
  reducer_->finish();
  timers_.stop("reduce");

  timers_.start("step");
  // 2. Overflow and norm: one fused pass over this rank's gradients (sum of squares +
  //    inf/NaN), agreed across ranks together with the loss in ONE small all-reduce.
  const precision::GradStats st = store_->grad_stats();
  double red[4] = {st.has_inf_or_nan ? 0.0 : st.sum_of_squares, st.has_inf_or_nan ? 1.0 : 0.0,
                   cycle_loss_nonfinite_ ? 1.0 : 0.0, cycle_losses_ > 0 ? cycle_loss_sum_ / cycle_losses_ : 0.0};
  if (world_ > 1) comm_->all_reduce(TensorView{red, 4, DType::F64}, ReduceOp::Sum);
  const double sumsq = store_->partitioned() ? red[0] : (st.has_inf_or_nan ? 0.0 : st.sum_of_squares);
  const bool grads_bad = red[1] > 0, loss_bad = red[2] > 0;
  const double mean_loss = red[3] / world_;
  const double used_scale = backward_scale_;  // the scale backward multiplied by
  const double post = reducer_->post_factor();
  global_grad_norm_ = grads_bad ? -1.0 : std::sqrt(sumsq) * post / used_scale;
  const bool overflow = (grads_bad && (wdtype_ != DType::BF16 || cfg_.bf16.check_grad_overflow)) || loss_bad;

  // 3. The loss scaler sees every boundary; other dtypes warn about a skipped step.
  const double lr = scheduler_->lr();
  last_lr_ = lr;
  if (wdtype_ == DType::F16) {
    scaler_.update(overflow);  // throws when stuck at the minimum scale; logs OVERFLOW lines
  } else if (overflow) {
    DS_WARN("non-finite " << (loss_bad ? "loss" : "gradients") << " at step " << global_steps_ + 1
            << ": skipping the optimizer step (skipped steps so far: " << skipped_steps_ + 1 << ")");
  }

  if (overflow) {
    skipped_steps_ += 1;
    last_step_applied_ = false;
  } else {
    // 4. Clip (as DeepSpeed's clip_grad_norm_): coef = 1 / max(1, (norm + 1e-6) / clip) on the
    //    unscaled averaged grads; 1/loss_scale, the averaging post-factor and the clip
    //    coefficient fold into one grad_scale the optimizer applies in its single pass.
    double coef = 1.0;
    if (cfg_.gradient_clipping > 0) {
      const double f = (global_grad_norm_ + 1e-6) / cfg_.gradient_clipping;
      if (f > 1.0) coef = 1.0 / f;
    }
    optim::StepContext ctx;
    ctx.lr = lr;
    ctx.step = ++applied_steps_;
    ctx.grad_scale = post / used_scale * coef;
    ctx.betas = scheduler_->betas();
    // 5. Optimizer, then (ZeRO) every rank gets every updated slice, then the scheduler.
    store_->optimizer_step(*optimizer_, ctx);
    if (store_->partitioned() && world_ > 1)
      store_->gather_params(device_ == Device::Cuda ? *device_comm_ : *comm_);
    scheduler_->step();
    last_step_applied_ = true;
  }
  store_->zero_grads();
  global_steps_ += 1;
  global_samples_ += cfg_.train_batch_size;
  timers_.stop("step");

  const double step_ms = step_clock_.elapsed_ms();
  step_clock_.reset();
  report_progress(overflow, mean_loss, step_ms);
  reset_cycle();
}

void Engine::reset_cycle() {
  cycle_loss_sum_ = 0;
  cycle_losses_ = 0;
  cycle_loss_nonfinite_ = false;
}

// ----------------------------------------------------------------------------------------
// reporting and accessors
// ----------------------------------------------------------------------------------------

void Engine::report_progress(bool overflow, double loss, double step_ms) {
  if (csv_) {
    engine::CsvRow row;
    row.step = global_steps_;
    row.samples = global_samples_;
    row.loss = loss;
    row.lr = last_lr_;
    row.loss_scale = backward_scale_;
    row.grad_norm = global_grad_norm_;
    row.overflow = overflow;
    row.skipped_steps = skipped_steps_;
    row.step_time_ms = step_ms;
    csv_->write(row);
  }
  // steps_per_print unset: no progress lines (DeepSpeed >= 0.15.2), except that
  // wall_clock_breakdown alone reports every step as DeepSpeed's timers do.
  const std::int64_t every = cfg_.steps_per_print.value_or(cfg_.wall_clock_breakdown ? 1 : 0);
  if (every > 0 && global_steps_ % every == 0) {
    std::ostringstream os;
    os.precision(6);
    os << "step=" << global_steps_ << " loss=" << loss << " lr=" << last_lr_ << " loss_scale=" << backward_scale_
       << " grad_norm=" << global_grad_norm_ << " skipped=" << skipped_steps_
       << " samples/s=" << (step_ms > 0 ? double(cfg_.train_batch_size) * 1000.0 / step_ms : 0.0)
       << " step_time_ms=" << step_ms;
    if (cfg_.wall_clock_breakdown) {
      const auto per_step = [&](const char* n) { return timers_.total_ms(n) / double(every); };
      os << " | forward_ms=" << per_step("forward") << " backward_ms=" << per_step("backward")
         << " reduce_ms=" << per_step("reduce") << " step_ms=" << per_step("step");
      timers_.reset();
    }
    DS_INFO(os.str());
  }
}

double Engine::get_lr() const { return scheduler_->lr(); }

engine::ModelStateBytes Engine::memory_report() const {
  engine::ModelStateBytes b;
  store_->add_memory(b);
  if (store_->grad_pages() && map_.stage == 2 && world_ > 1) {  // ZeRO-2: measured
    const GradientMemory g = gradient_memory();
    b.grad_buckets = g.peak_resident > g.partition ? g.peak_resident - g.partition : 0;
  }
  std::size_t opt = 0;
  for (const auto& t : optimizer_->state_tensors()) opt += t.second.size() * sizeof(float);
  b.optimizer_state = opt;
  b.comm_scratch += reducer_->scratch_bytes();
  return b;
}

Engine::GradientMemory Engine::gradient_memory() const {
  GradientMemory g;
  const engine::PagedBuffer* pages = store_->grad_pages();
  if (!pages) return g;  // gradients on a device
  const auto [keep_lo, keep_hi] = store_->kept_bytes();
  g.reserved = pages->mapped_bytes();
  g.resident = pages->resident_bytes();
  g.partition = pages->resident_bytes(keep_lo, keep_hi);
  g.peak_resident = std::max(reducer_->peak_resident(), g.resident);
  return g;
}

std::vector<float> Engine::gather_params_fp32() const { return store_->params_fp32(); }

}  // namespace ds
