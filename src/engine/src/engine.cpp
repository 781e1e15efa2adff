// The training engine (docs/dev/engine.md), following DeepSpeed's runtime/engine.py and
// runtime/zero/stage_1_and_2.py.
#include "ds/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "ds/config/parse.h"
#include "ds/core/hash.h"
#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/core/log.h"
#include "ds/engine/monitor.h"
#include "device_store.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/init.h"
#include "ds/optim/optimizer.h"
#include "ds/precision/grad_stats.h"
#include "ds/sched/lr_scheduler.h"

namespace ds {

namespace {

TensorView sub_view(const HostBuffer& b, DType t, std::size_t offset, std::size_t count) {
  auto* base = static_cast<char*>(const_cast<void*>(b.data()));
  return TensorView{base + offset * dtype_size(t), count, t};
}
TensorView sub_view(const engine::PagedBuffer& b, DType t, std::size_t offset, std::size_t count) {
  return TensorView{static_cast<char*>(b.data()) + offset * dtype_size(t), count, t};
}

// x *= f over a F32 / F16 / BF16 view (prescaled gradient averaging).
void scale_in_place(TensorView v, float f) {
  if (f == 1.0f || v.count == 0) return;
  switch (v.dtype) {
    case DType::F32: {
      float* p = v.as<float>();
#pragma omp parallel for schedule(static) if (v.count > (1u << 16))
      for (std::int64_t i = 0; i < std::int64_t(v.count); ++i) p[i] *= f;
      return;
    }
    case DType::F16: {
      f16* p = v.as<f16>();
#pragma omp parallel for schedule(static) if (v.count > (1u << 16))
      for (std::int64_t i = 0; i < std::int64_t(v.count); ++i) p[i] = float_to_f16(f16_to_float(p[i]) * f);
      return;
    }
    case DType::BF16: {
      bf16* p = v.as<bf16>();
#pragma omp parallel for schedule(static) if (v.count > (1u << 16))
      for (std::int64_t i = 0; i < std::int64_t(v.count); ++i) p[i] = float_to_bf16(bf16_to_float(p[i]) * f);
      return;
    }
    default:
      DS_THROW("gradient scaling: unsupported dtype " << dtype_name(v.dtype));
  }
}

void zero_range(const engine::PagedBuffer& b, DType t, std::size_t begin, std::size_t end) {
  if (end <= begin) return;
  TensorView v = sub_view(b, t, begin, end - begin);
  std::memset(v.data, 0, v.bytes());
}

}  // namespace

// ----------------------------------------------------------------------------------------
// initialize
// ----------------------------------------------------------------------------------------

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

// ----------------------------------------------------------------------------------------
// construction
// ----------------------------------------------------------------------------------------

Engine::Engine(config::DsConfig cfg, Module& module, std::shared_ptr<Communicator> comm,
               std::shared_ptr<void> dist_keepalive, std::shared_ptr<Communicator> device_comm)
    : cfg_(std::move(cfg)), module_(&module), comm_(std::move(comm)), dist_keepalive_(std::move(dist_keepalive)),
      device_comm_(std::move(device_comm)), device_(module.device()) {
  DS_CHECK(comm_ != nullptr, "ds::Engine needs a communicator");
  rank_ = comm_->rank();
  world_ = comm_->size();
  config::resolve_batch_sizes(cfg_, world_);
  validate_config();
  // A peer that never arrives (stopped, dead) ends the job after this long instead of hanging it.
  comm_->set_timeout(cfg_.comms_config.timeout);
  if (device_comm_) device_comm_->set_timeout(cfg_.comms_config.timeout);
  if (on_device()) {
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

  // ---- layout ----
  const auto infos = module_->parameters();
  DS_CHECK(!infos.empty(), "the module has no parameters: nothing to train");
  map_ = engine::make_partition_map(infos, world_, cfg_.zero_optimization.stage);
  DS_CHECK(map_.total_numel > 0, "the module's parameters have zero elements in total");
  check_same_model_on_all_ranks(infos);
  slice_ = map_.slices[std::size_t(rank_)];
  segments_ = map_.segments(rank_);
  for (const auto& sg : segments_) optim_segments_.push_back(optim::Segment{sg.slice_offset, sg.count});

  // ---- storage, allocated once ----
  params_ = HostBuffer(map_.padded_numel, wdtype_);
  // Gradients: address space for the whole flat space; the pages that stay resident (all of
  // them, or at stage 2 this rank's slice) are touched once here (docs/dev/engine.md "Stage 2").
  // A CUDA module's gradients live on the device only.
  if (!on_device()) grads_ = engine::PagedBuffer(map_.padded_numel, wdtype_);
  release_grads_ = map_.stage == 2 && world_ > 1;
  keep_lo_ = 0;
  keep_hi_ = grads_.mapped_bytes();
  if (release_grads_) {
    const std::size_t ps = engine::PagedBuffer::page_size(), es = dtype_size(wdtype_);
    keep_lo_ = slice_.offset * es / ps * ps;
    keep_hi_ = std::min(grads_.mapped_bytes(), ((slice_.offset + slice_.count) * es + ps - 1) / ps * ps);
    max_in_flight_ = 2;  // DeepSpeed's two ipg buffers: one filling, one reducing
  }
  if (!on_device()) grads_.touch(keep_lo_, keep_hi_);
  master_ = HostBuffer(slice_.count, DType::F32);
  if (accum_fp32_) accum_ = HostBuffer(slice_.count, DType::F32);
  if (on_device()) dev_ = std::make_unique<engine::DeviceStore>(map_.padded_numel, wdtype_, slice_.count, module_->device_stream());
  if (map_.stage >= 1 && world_ > 1 && on_device()) {
    gather_chunk_ = map_.partition_numel;  // NCCL gathers the whole partition in place
  } else if (map_.stage >= 1 && world_ > 1) {
    const std::size_t per_rank = std::size_t(std::max<std::int64_t>(1, cfg_.zero_optimization.allgather_bucket_size / world_));
    gather_chunk_ = std::min(per_rank, map_.partition_numel);
    if (gather_chunk_ < map_.partition_numel) gather_recv_ = HostBuffer(gather_chunk_ * std::size_t(world_), wdtype_);
  }

  // ---- initial values: module init on fp32 scratch, rank 0's values broadcast ----
  {
    HostBuffer scratch(map_.padded_numel, DType::F32);
    float* s = scratch.as<float>();
    std::vector<std::span<float>> spans;
    spans.reserve(map_.params.size());
    for (const auto& p : map_.params) spans.emplace_back(s + p.offset, p.numel);
    module_->init_parameters(spans, cfg_.seed.value_or(42));
    if (world_ > 1) comm_->broadcast(TensorView{s, map_.padded_numel, DType::F32}, 0);
    std::memcpy(master_.data(), s + slice_.offset, slice_.count * sizeof(float));
    convert(s, DType::F32, params_.data(), wdtype_, map_.padded_numel);
  }
  if (on_device()) dev_->upload(params_, master_);

  // ---- bind the module's views ----
  for (const auto& p : map_.params) {
    param_views_.push_back(param_range(p.offset, p.numel));
    grad_views_.push_back(grad_range(p.offset, p.numel));
  }
  module_->bind(param_views_, grad_views_);

  // ---- optimizer, scaler, scheduler ----
  const config::OptimizerConfig ocfg = cfg_.optimizer.value_or(config::OptimizerConfig{});
  optimizer_ = optim::make_optimizer(ocfg, on_device() ? optim::Kernel::Cuda : optim::Kernel::Cpu);
  optimizer_->init_state(map_.stage >= 1 ? slice_.real_count : map_.total_numel);
  if (cfg_.fp16.enabled) {
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
  scheduler_ = sched::make_scheduler(cfg_.scheduler.value_or(config::SchedulerConfig{}), ocfg.lr, ocfg.betas);

  // ---- gradient averaging factors (DeepSpeed's allreduce_bucket: data-parallel averaging) ----
  if (world_ > 1) {
    const double W = world_, pd = cfg_.gradient_predivide_factor;
    if (cfg_.prescale_gradients) {
      pre_factor_ = 1.0 / W;
      post_factor_ = 1.0;
    } else {
      pre_factor_ = pd != 1.0 ? 1.0 / pd : 1.0;
      post_factor_ = pd / W;
    }
    // Stage 2 keeps the accumulated partition inside the reduced buffer, so a pre-scale
    // would rescale it again every micro-step: apply the whole factor after the reduction.
    // The GPU path does the same (the optimizer kernel applies it as part of grad_scale).
    if (map_.stage == 2 || on_device()) {
      post_factor_ *= pre_factor_;
      pre_factor_ = 1.0;
    }
  }

  build_buckets();
  if (comm_dtype_ != wdtype_ && world_ > 1) {
    // Stage 2: a pool of max_in_flight_ bucket-sized slots, reused (bucket k uses slot
    // k % slots; at most that many reduce at once). Stages 0/1: the whole flat space.
    std::size_t n = map_.padded_numel;
    if (release_grads_) {
      const std::size_t bsz = buckets_[0].end - buckets_[0].begin;  // the largest bucket
      const std::size_t slots = std::min(max_in_flight_, buckets_.size());
      for (std::size_t k = 0; k < buckets_.size(); ++k) buckets_[k].wire = (k % slots) * bsz;
      n = slots * bsz;
    }
    comm_buf_ = HostBuffer(n, comm_dtype_);
  }
  param_ready_.assign(map_.params.size(), 0);

  if (cfg_.csv_monitor.enabled && rank_ == 0)
    csv_ = std::make_unique<engine::CsvMonitor>(cfg_.csv_monitor.output_path, cfg_.csv_monitor.job_name);

  DS_INFO("dstrain engine: " << (on_device() ? "CUDA device, " : "") << map_.params.size() << " parameter tensors, " << map_.total_numel
          << " parameters, ZeRO stage " << map_.stage << ", " << dtype_name(wdtype_) << " working / "
          << dtype_name(comm_dtype_) << " communication, world size " << world_ << ", micro batch "
          << cfg_.train_micro_batch_size_per_gpu << " x gas " << cfg_.gradient_accumulation_steps
          << " -> train batch " << cfg_.train_batch_size << "; model states per rank: "
          << memory_report().to_string());
  step_clock_.reset();
}

Engine::~Engine() {
  // Outstanding non-blocking operations own their buffers until waited.
  for (auto& b : buckets_) {
    if (b.work) {
      try {
        b.work->wait();
      } catch (...) {
      }
    }
  }
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

void Engine::validate_config() {
  const auto& c = cfg_;
  DS_CHECK(!(c.fp16.enabled && c.bf16.enabled),
           c.source << ": fp16.enabled and bf16.enabled are both true; enable at most one");
  DS_CHECK(c.zero_optimization.stage >= 0 && c.zero_optimization.stage <= 2,
           c.source << ": zero_optimization.stage " << c.zero_optimization.stage
                    << " is not supported (dstrain implements stages 0, 1 and 2)");
  DS_CHECK(c.gradient_accumulation_steps >= 1 && c.train_micro_batch_size_per_gpu >= 1,
           c.source << ": batch sizes did not resolve (gradient_accumulation_steps "
                    << c.gradient_accumulation_steps << ", train_micro_batch_size_per_gpu "
                    << c.train_micro_batch_size_per_gpu << ")");
  DS_CHECK(c.gradient_clipping >= 0, c.source << ": gradient_clipping must be >= 0, got " << c.gradient_clipping);
  DS_CHECK(c.gradient_predivide_factor > 0,
           c.source << ": gradient_predivide_factor must be > 0, got " << c.gradient_predivide_factor);
  DS_CHECK(c.zero_optimization.reduce_bucket_size > 0,
           c.source << ": zero_optimization.reduce_bucket_size must be > 0");
  DS_CHECK(c.zero_optimization.allgather_bucket_size > 0,
           c.source << ": zero_optimization.allgather_bucket_size must be > 0");
  wdtype_ = c.fp16.enabled ? DType::F16 : c.bf16.enabled ? DType::BF16 : DType::F32;
  comm_dtype_ = wdtype_;
  if (c.data_types.grad_accum_dtype) {
    // The parser checks this too; a DsConfig built in code gets the same answer here.
    const std::string& a = *c.data_types.grad_accum_dtype;
    DS_CHECK(a == "fp32" || a == dtype_name(wdtype_),
             c.source << ": data_types.grad_accum_dtype '" << a << "' is not supported with the "
                      << dtype_name(wdtype_) << " working dtype; supported: fp32 or " << dtype_name(wdtype_));
    accum_fp32_ = a == "fp32" && wdtype_ != DType::F32;
  }
  if (c.communication_data_type) {
    DType t;
    try {
      t = parse_dtype(*c.communication_data_type);
    } catch (const Error&) {
      DS_THROW(c.source << ": communication_data_type '" << *c.communication_data_type
                        << "' is not one of fp32, fp16, bf16");
    }
    DS_CHECK(t == DType::F32 || t == DType::F16 || t == DType::BF16,
             c.source << ": communication_data_type '" << *c.communication_data_type
                      << "' is not one of fp32, fp16, bf16");
    comm_dtype_ = t;
  }
  const std::string opt = c.optimizer ? c.optimizer->type : "adam";
  if (opt == "lamb") {
    DS_CHECK(!(c.fp16.enabled && c.fp16.loss_scale > 0),
             c.source << ": the Lamb optimizer needs dynamic loss scaling with fp16 (DeepSpeed's "
                         "FusedLamb); remove fp16.loss_scale or set it to 0");
    DS_CHECK(c.zero_optimization.stage == 0,
             c.source << ": the Lamb optimizer computes per-tensor trust ratios and is not supported with "
                         "ZeRO (zero_optimization.stage " << c.zero_optimization.stage
                      << "); use Adam/AdamW with ZeRO or stage 0 with Lamb");
  }
}

void Engine::build_buckets() {
  // Buckets cover the padded flat space from its END backwards (backward finishes the last
  // parameters first); buckets_[0] is the tail. Sizes: reduce_bucket_size elements, at most
  // the whole space (a small model gets one bucket and allocates nothing extra: buckets are
  // ranges of grads_, reduced in place).
  const std::size_t total = map_.padded_numel;
  const std::size_t bsz = std::size_t(std::min<std::int64_t>(cfg_.zero_optimization.reduce_bucket_size,
                                                             std::int64_t(total)));
  buckets_.clear();
  for (std::size_t end = total; end > 0;) {
    const std::size_t begin = end > bsz ? end - bsz : 0;
    Bucket b;
    b.begin = begin;
    b.end = end;
    b.wire = begin;
    buckets_.push_back(std::move(b));
    end = begin;
  }
  param_buckets_.assign(map_.params.size(), {});
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    for (std::size_t i = 0; i < map_.params.size(); ++i) {
      const auto& p = map_.params[i];
      if (p.numel == 0) continue;
      if (p.offset < buckets_[k].end && p.offset + p.numel > buckets_[k].begin) {
        buckets_[k].params_total++;
        param_buckets_[i].push_back(k);
      }
    }
  }
}

// ----------------------------------------------------------------------------------------
// forward / backward
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
  const float scale = float(backward_scale_ / gas);
  // fp32 accumulation folds reduced gradients into accum_ after every backward, so every
  // stage then reduces on every micro-step, as ZeRO-2 always does.
  reducing_this_backward_ = world_ > 1 && (map_.stage == 2 || accum_fp32_ || is_gradient_accumulation_boundary());
  if (reducing_this_backward_) {
    for (auto& b : buckets_) {
      b.params_ready = 0;
      b.launched = false;
    }
    std::fill(param_ready_.begin(), param_ready_.end(), 0);
    next_launch_ = 0;
    next_finish_ = 0;
    if (release_grads_) populate_bucket(0);  // backward writes the tail first
  }
  module_->backward(scale, [this](std::size_t i) { on_grad_ready(i); });
  timers_.stop("backward");
  if (reducing_this_backward_) {
    timers_.start("reduce");
    // Buckets whose parameters never reported (unused parameters, a module without
    // callbacks) start now, still in index order so every rank issues the same sequence.
    for (; next_launch_ < buckets_.size(); ++next_launch_) launch_bucket(next_launch_);
    if (map_.stage == 2) {
      // ZeRO-2 reduces every micro-step: keep only this rank's slice (which accumulates the
      // reduced sums across micro-steps: other ranks contribute zeros there), drop the rest:
      // the pages outside the slice go back to the kernel as their buckets finish (they read
      // as zero next time); other ranks' elements on the slice's first and last pages are
      // zeroed here.
      while (next_finish_ < buckets_.size()) finish_and_release(next_finish_++);
      const std::size_t es = dtype_size(wdtype_);
      zero_range(grads_, wdtype_, keep_lo_ / es, slice_.offset);
      zero_range(grads_, wdtype_, slice_.offset + slice_.count, std::min(keep_hi_ / es, map_.padded_numel));
    } else if (accum_fp32_) {
      for (auto& b : buckets_) finish_bucket(b);  // folded below
    } else {
      cycle_reduced_ = true;  // waited for in step()
    }
    timers_.stop("reduce");
    reducing_this_backward_ = false;
  }
  if (accum_fp32_) fold_into_accum();
  return float(loss / gas);
}

void Engine::fold_into_accum() {
  float* acc = accum_.as<float>();
  const std::int64_t n = std::int64_t(slice_.count);
  TensorView g = sub_view(grads_, wdtype_, slice_.offset, slice_.count);
  if (wdtype_ == DType::BF16) {
    const bf16* p = g.as<bf16>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (std::int64_t j = 0; j < n; ++j) acc[j] += bf16_to_float(p[j]);
  } else {
    const f16* p = g.as<f16>();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (std::int64_t j = 0; j < n; ++j) acc[j] += f16_to_float(p[j]);
  }
  // Stage 2 (world > 1) already zeroed or released everything outside the slice; stages 0/1
  // hold the whole (reduced) space, which must read zero for the next backward.
  if (release_grads_) zero_range(grads_, wdtype_, slice_.offset, slice_.offset + slice_.count);
  else zero_range(grads_, wdtype_, 0, map_.padded_numel);
}

TensorView Engine::step_grads(std::size_t offset, std::size_t count) const {
  if (accum_fp32_) return sub_view(accum_, DType::F32, offset - slice_.offset, count);
  return grad_range(offset, count);
}

void Engine::on_grad_ready(std::size_t i) {
  if (!reducing_this_backward_) return;
  DS_CHECK(i < param_ready_.size(), "Module::backward reported grad_ready(" << i << ") but the module has "
                                    << param_ready_.size() << " parameters");
  if (param_ready_[i]) return;  // a repeated call changes nothing
  param_ready_[i] = 1;
  for (std::size_t k : param_buckets_[i]) buckets_[k].params_ready++;
  launch_ready_buckets();
  if (release_grads_) reap_finished_buckets();
}

void Engine::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() &&
         buckets_[next_launch_].params_ready >= buckets_[next_launch_].params_total) {
    launch_bucket(next_launch_);
    ++next_launch_;
  }
}

void Engine::launch_bucket(std::size_t k) {
  Bucket& b = buckets_[k];
  if (b.launched) return;
  // Stage 2: at most max_in_flight_ buckets reducing (launches and finishes both go in
  // index order, so the ones in flight are [next_finish_, k)).
  if (release_grads_ && k - next_finish_ >= max_in_flight_) {
    timers_.start("bucket_wait");
    while (k - next_finish_ >= max_in_flight_) finish_and_release(next_finish_++);
    timers_.stop("bucket_wait");
  }
  const std::size_t n = b.end - b.begin;
  TensorView g = grad_range(b.begin, n);
  TensorView wire = g;
  if (comm_buf_.bytes() > 0) {
    wire = sub_view(comm_buf_, comm_dtype_, b.wire, n);
    convert(g.data, wdtype_, wire.data, comm_dtype_, n);
  }
  if (!on_device()) scale_in_place(wire, float(pre_factor_));  // the GPU path has pre_factor_ 1
  b.work = grad_comm().iall_reduce(wire, ReduceOp::Sum);
  b.launched = true;
  if (release_grads_) populate_bucket(k + 1);  // the bucket backward is writing now
}

void Engine::populate_bucket(std::size_t k) {
  // Batch-faults the released pages of bucket k in one madvise(MADV_POPULATE_WRITE): about
  // 2.5 us a page here, against 5 us for a fault on first write and 8-10 us for the read
  // fault + write fault of a `+=` into a released page (bench/zero/page_release_bench).
  // Pages already present are left alone, so a bucket already (partly) written is fine.
  if (k >= buckets_.size()) return;
  const Bucket& b = buckets_[k];
  const std::size_t ps = engine::PagedBuffer::page_size(), es = dtype_size(wdtype_);
  const std::size_t lo = b.begin * es / ps * ps;
  const std::size_t hi = std::min(grads_.mapped_bytes(), (b.end * es + ps - 1) / ps * ps);
  grads_.populate(lo, std::max(lo, std::min(hi, keep_lo_)));
  grads_.populate(std::max(lo, keep_hi_), std::max(hi, keep_hi_));
}

void Engine::finish_bucket(Bucket& b) {
  if (!b.work) return;
  b.work->wait();
  b.work.reset();
  if (comm_buf_.bytes() > 0) {
    const std::size_t n = b.end - b.begin;
    convert(sub_view(comm_buf_, comm_dtype_, b.wire, n).data, comm_dtype_,
            sub_view(grads_, wdtype_, b.begin, n).data, wdtype_, n);
  }
}

void Engine::finish_and_release(std::size_t k) {
  Bucket& b = buckets_[k];
  finish_bucket(b);
  // Bucket k releases bytes [lo, hi): from the first page boundary at or after its first
  // element to the first page boundary at or after its end. So a page shared with bucket
  // k + 1 (lower addresses, finishes later) goes with k + 1, and one shared with k - 1
  // (already finished) goes now; together the buckets cover the whole mapping. The
  // partition's pages [keep_lo_, keep_hi_) are never released.
  const std::size_t ps = engine::PagedBuffer::page_size(), es = dtype_size(wdtype_);
  const std::size_t lo = b.begin == 0 ? 0 : (b.begin * es + ps - 1) / ps * ps;
  const std::size_t hi = b.end == map_.padded_numel ? grads_.mapped_bytes() : (b.end * es + ps - 1) / ps * ps;
  if (hi <= lo) return;
  // Resident pages only grow between releases, so sampling before each release sees the peak.
  grad_peak_resident_ = std::max(grad_peak_resident_, grads_.resident_bytes());
  grads_.release(lo, std::max(lo, std::min(hi, keep_lo_)));
  grads_.release(std::max(lo, keep_hi_), hi);
}

void Engine::reap_finished_buckets() {
  while (next_finish_ < next_launch_) {
    Bucket& b = buckets_[next_finish_];
    if (b.work && !b.work->test()) return;
    finish_and_release(next_finish_++);
  }
}

void Engine::launch_all_and_wait() {
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    buckets_[k].launched = false;
    launch_bucket(k);
  }
  for (auto& b : buckets_) finish_bucket(b);
}

void Engine::zero_grads() {
  if (on_device()) return dev_->zero_grads();
  if (accum_fp32_) std::memset(accum_.data(), 0, accum_.bytes());
  if (release_grads_) {  // normally nothing outside the partition is resident here
    grads_.release(0, keep_lo_);
    grads_.release(keep_hi_, grads_.mapped_bytes());
  }
  grads_.touch(keep_lo_, keep_hi_);
}

// ----------------------------------------------------------------------------------------
// step
// ----------------------------------------------------------------------------------------

void Engine::step() {
  if (is_gradient_accumulation_boundary()) {
    boundary_step();
  } else {
    last_step_applied_ = false;
  }
  micro_steps_ += 1;
}

void Engine::boundary_step() {
  // 1. Finish the gradient reduction (stages 0/1: the buckets the last backward started).
  timers_.start("reduce");
  if (world_ > 1 && map_.stage < 2 && !accum_fp32_) {  // accum_fp32_: reduced in backward
    if (cycle_reduced_) {
      for (auto& b : buckets_) finish_bucket(b);
    } else {
      launch_all_and_wait();  // step() without a boundary backward: still reduce
    }
  }
  cycle_reduced_ = false;
  timers_.stop("reduce");

  timers_.start("step");
  // 2. One fused pass over this rank's gradients: sum of squares + inf/NaN; agreed across
  //    ranks together with the loss in ONE small all-reduce.
  const bool partitioned = map_.stage >= 1;
  const std::size_t g_off = partitioned ? slice_.offset : 0;
  const std::size_t g_cnt = partitioned ? slice_.real_count : map_.total_numel;
  const precision::GradStats st =
      on_device() ? dev_->grad_stats(g_off, g_cnt) : precision::grad_stats(step_grads(g_off, g_cnt), 1.0);
  double red[4] = {st.has_inf_or_nan ? 0.0 : st.sum_of_squares, st.has_inf_or_nan ? 1.0 : 0.0,
                   cycle_loss_nonfinite_ ? 1.0 : 0.0, cycle_losses_ > 0 ? cycle_loss_sum_ / cycle_losses_ : 0.0};
  if (world_ > 1) comm_->all_reduce(TensorView{red, 4, DType::F64}, ReduceOp::Sum);
  const double sumsq = partitioned ? red[0] : (st.has_inf_or_nan ? 0.0 : st.sum_of_squares);
  const bool grads_bad = red[1] > 0;
  const bool loss_bad = red[2] > 0;
  const double mean_loss = red[3] / world_;

  const double used_scale = backward_scale_;  // the scale backward multiplied by
  global_grad_norm_ = grads_bad ? -1.0 : std::sqrt(sumsq) * post_factor_ / used_scale;

  bool overflow;
  if (wdtype_ == DType::F16) {
    overflow = grads_bad || loss_bad;
  } else if (wdtype_ == DType::BF16) {
    overflow = (grads_bad && cfg_.bf16.check_grad_overflow) || loss_bad;
  } else {
    overflow = grads_bad || loss_bad;
  }

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
    // 3. Clip (as DeepSpeed's clip_grad_norm_): coef = 1 / max(1, (norm + 1e-6) / clip) on the unscaled averaged grads;
    //    1/loss_scale, the averaging post-factor and the clip coefficient fold into one
    //    grad_scale the optimizer applies in its single pass.
    double coef = 1.0;
    if (cfg_.gradient_clipping > 0) {
      const double f = (global_grad_norm_ + 1e-6) / cfg_.gradient_clipping;
      if (f > 1.0) coef = 1.0 / f;
    }
    optim::StepContext ctx;
    ctx.lr = lr;
    ctx.step = ++applied_steps_;
    ctx.grad_scale = post_factor_ / used_scale * coef;
    ctx.betas = scheduler_->betas();
    const std::size_t n = partitioned ? slice_.real_count : map_.total_numel;
    if (n > 0) {
      float* master = on_device() ? dev_->master() : master_.as<float>();
      if (on_device()) ctx.stream = dev_->stream();
      optimizer_->step(std::span<float>(master, n), step_grads(g_off, n), param_range(g_off, n), optim_segments_, ctx);
    }
    // 4. ZeRO: every rank gets every updated slice.
    if (partitioned && world_ > 1) allgather_params();
    scheduler_->step();
    last_step_applied_ = true;
  }
  zero_grads();
  global_steps_ += 1;
  global_samples_ += cfg_.train_batch_size;
  timers_.stop("step");

  const double step_ms = step_clock_.elapsed_ms();
  step_clock_.reset();
  report_progress(overflow, mean_loss, step_ms);
  cycle_loss_sum_ = 0;
  cycle_losses_ = 0;
  cycle_loss_nonfinite_ = false;
}

void Engine::allgather_params() {
  // Updated working params of each slice -> every rank, allgather_bucket_size elements per
  // collective (gather_chunk_ per rank).
  const std::size_t S = map_.partition_numel, W = std::size_t(world_), es = dtype_size(wdtype_);
  char* base = static_cast<char*>(param_range(0, 0).data);
  for (std::size_t c = 0; c < S; c += gather_chunk_) {
    const std::size_t k = std::min(gather_chunk_, S - c);
    TensorView send{base + (slice_.offset + c) * es, k, wdtype_};
    if (gather_chunk_ == S) {  // always on the GPU path
      grad_comm().all_gather(send, TensorView{base, S * W, wdtype_});  // in place: send is block rank
    } else {
      char* rb = static_cast<char*>(gather_recv_.data());
      comm_->all_gather(send, TensorView{rb, k * W, wdtype_});
      for (std::size_t r = 0; r < W; ++r) {
        if (int(r) == rank_) continue;
        std::memcpy(base + (r * S + c) * es, rb + r * k * es, k * es);
      }
    }
  }
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
      const auto per_step = [&](const char* n) {
        return timers_.total_ms(n) / double(every);
      };
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
  b.params = params_.bytes();
  if (on_device()) {
    b.grads = map_.padded_numel * dtype_size(wdtype_);  // on the device, as params and master
  } else if (release_grads_) {
    const GradientMemory g = gradient_memory();
    b.grads = g.partition;
    b.grad_buckets = g.peak_resident > g.partition ? g.peak_resident - g.partition : 0;
  } else {
    b.grads = grads_.bytes();
  }
  b.grads += accum_.bytes();  // the fp32 accumulation buffer (data_types.grad_accum_dtype)
  b.master = master_.bytes();
  std::size_t opt = 0;
  for (const auto& t : optimizer_->state_tensors()) opt += t.second.size() * sizeof(float);
  b.optimizer_state = opt;
  b.comm_scratch = comm_buf_.bytes() + gather_recv_.bytes();
  return b;
}

Engine::GradientMemory Engine::gradient_memory() const {
  GradientMemory g;
  g.reserved = grads_.mapped_bytes();
  g.resident = grads_.resident_bytes();
  g.partition = grads_.resident_bytes(keep_lo_, keep_hi_);
  g.peak_resident = std::max(grad_peak_resident_, g.resident);
  return g;
}

std::vector<float> Engine::gather_params_fp32() const {
  std::vector<float> out(map_.total_numel);
  if (on_device()) {
    HostBuffer p(map_.padded_numel, wdtype_);
    dev_->download_params(p);
    convert(p.data(), wdtype_, out.data(), DType::F32, map_.total_numel);
    return out;
  }
  convert(params_.data(), wdtype_, out.data(), DType::F32, map_.total_numel);
  return out;
}

TensorView Engine::param_range(std::size_t offset, std::size_t count) const {
  return on_device() ? dev_->params(offset, count) : sub_view(params_, wdtype_, offset, count);
}

TensorView Engine::grad_range(std::size_t offset, std::size_t count) const {
  return on_device() ? dev_->grads(offset, count) : sub_view(grads_, wdtype_, offset, count);
}

void Engine::device_to_host() {
  if (!on_device()) return;
  dev_->download(params_, master_);
  optimizer_->download_state();
}

void Engine::host_to_device(bool with_optimizer_state) {
  if (!on_device()) return;
  dev_->upload(params_, master_);
  if (with_optimizer_state) optimizer_->upload_state();
}

}  // namespace ds
