// ds::initialize and the Engine's setup helpers: the config limits of the GPU path, the
// same-model check across ranks, the loss scaler.
#include "ds/engine/engine.h"

#include <algorithm>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/core/hash.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/comms_logger.h"
#include "ds/mpi/device_comm.h"
#include "ds/mpi/init.h"
#include "ds/core/log.h"
#include "zero3_fetcher.h"

namespace ds {

InitResult initialize(config::DsConfig cfg, Module& module, std::shared_ptr<Communicator> comm,
                      std::shared_ptr<Communicator> device_comm) {
  std::shared_ptr<void> keepalive;
  if (!comm) {
    auto ctx = std::make_shared<DistributedContext>(init_distributed());
    comm = ctx->comm;
    // NCCL or staged by communication.device_backend and the rule in ds/mpi/device_comm.h.
    if (!device_comm && module.device() == Device::Cuda && ctx->world_size > 1)
      device_comm = make_device_communicator(*ctx, cfg.communication.device_backend,
                                             cfg.source + ": communication.device_backend");
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

// comms_logger: one log for both communicators, each wrapped so that every collective the
// engine (and a caller of comm()) runs is recorded. A prof_ops name that is not a collective
// stops initialize naming the key.
void Engine::enable_comms_logger() {
  const config::CommsLoggerConfig& c = cfg_.comms_logger;
  CommsLoggerOptions o;
  o.verbose = c.verbose;
  o.prof_all = c.prof_all;
  o.prof_ops = c.prof_ops;
  o.debug = c.debug;
  comms_log_ = std::make_shared<CommsLog>(std::move(o), rank_, world_, cfg_.source + ": comms_logger.prof_ops");
  comm_ = make_recording_communicator(comm_, comms_log_);
  if (device_comm_) device_comm_ = make_recording_communicator(device_comm_, comms_log_);
}

// What the GPU path (docs/dev/gpu.md) does not offer, refused at initialize naming the key.
void Engine::check_device_limits() const {
  // ZeRO stages 0-3: stage 2 keeps the gradients in a device paged buffer (chunks mapped and
  // unmapped with the driver's virtual memory calls), stage 3 the flat parameters and gradients
  // too (device_zero3_store.h), with every model state in device memory.
  DS_CHECK(cfg_.zero_optimization.stage <= 3,
           cfg_.source << ": zero_optimization.stage " << cfg_.zero_optimization.stage
                       << " with a model on a CUDA device: the GPU path supports stages 0 to 3");
  // Stage 3 on the device gathers from this rank's pieces in device memory; nothing moves them
  // to host memory or NVMe.
  DS_CHECK(cfg_.zero_optimization.offload_param.device == "none",
           cfg_.source << ": zero_optimization.offload_param.device \"" << cfg_.zero_optimization.offload_param.device
                       << "\" with a model on a CUDA device: the GPU path keeps the parameters in device memory; set "
                          "zero_optimization.offload_param.device to \"none\" (or remove it)");
  // ZeRO-Offload's early gradient copies assume one reduction per accumulation cycle (the
  // boundary backward), and stage 2 reduces every micro-step.
  DS_CHECK(cfg_.zero_optimization.stage <= 1 || cfg_.zero_optimization.offload_optimizer.device != "cpu",
           cfg_.source << ": zero_optimization.stage " << cfg_.zero_optimization.stage
                       << " with zero_optimization.offload_optimizer.device \"cpu\" and a model on a CUDA device: the "
                          "GPU path offloads the optimizer at stage 1; set zero_optimization.stage 1");
  DS_CHECK(comm_dtype_ == wdtype_,
           cfg_.source << ": communication_data_type " << dtype_name(comm_dtype_) << " differs from the working dtype "
                       << dtype_name(wdtype_) << "; the GPU path reduces gradients in the working dtype (remove the key)");
  DS_CHECK(world_ == 1 || (device_comm_ && device_comm_->size() == world_),
           "the module runs on a CUDA device and the job has " << world_ << " ranks: gradients need a device "
           "communicator of the same ranks (ds::initialize(cfg, model, comm, make_device_communicator(ctx, \"auto\")))");
  DS_CHECK(!cfg_.zero_optimization.offload_optimizer.nvme(),
           cfg_.source << ": zero_optimization.offload_optimizer.device \"nvme\" with a model on a CUDA device: the GPU "
                          "path offloads the optimizer to host memory only: set zero_optimization.offload_optimizer.device "
                          "to \"cpu\"");
  DS_CHECK(!accum_fp32_,
           cfg_.source << ": data_types.grad_accum_dtype fp32 with the " << dtype_name(wdtype_)
                       << " working dtype: the GPU path accumulates gradients in the working dtype; remove the key "
                          "or set it to " << dtype_name(wdtype_));
}

engine::FetchOptions Engine::fetch_options() const {
  const auto& z = cfg_.zero_optimization;
  engine::FetchOptions o;
  auto elems = [](std::int64_t v) { return std::size_t(std::max<std::int64_t>(0, v)); };
  o.prefetch_elems = elems(z.prefetch_bucket_size);
  o.max_live = elems(z.max_live_parameters);
  o.max_reuse = elems(z.max_reuse_distance);
  o.persistence_threshold = elems(z.param_persistence_threshold);
  o.model_persistence_threshold = elems(z.model_persistence_threshold);
  o.overlap = z.overlap_comm_effective();
  o.reduce_bucket = elems(z.reduce_bucket_size);
  o.whole_model = module_->parameter_groups().empty();
  o.comm_dtype = comm_dtype_;
  return o;
}

engine::NvmeOptions Engine::nvme_options() const {
  const auto& z = cfg_.zero_optimization;
  engine::NvmeOptions o;
  if (device_ == Device::Cuda) return o;  // the GPU path offloads to host memory only (check_device_limits)
  if (rank_ == 0) {
    // device "cpu" on the CPU path: the states are in host memory already.
    using Entry = std::pair<const char*, const config::OffloadConfig*>;
    for (const auto& [key, c] : {Entry{"offload_optimizer", &z.offload_optimizer}, Entry{"offload_param", &z.offload_param}})
      if (c->device == "cpu")
        DS_INFO("zero_optimization." << key << ".device \"cpu\": the model trains on the CPU, so its states are in "
                "host memory already; nothing moves (\"nvme\" moves them to files)");
  }
  o.optimizer = z.offload_optimizer.nvme();
  o.params = z.offload_param.nvme();
  o.optimizer_path = z.offload_optimizer.nvme_path;
  o.params_path = z.offload_param.nvme_path;
  o.optimizer_key = "zero_optimization.offload_optimizer.nvme_path";
  o.params_key = "zero_optimization.offload_param.nvme_path";
  o.sub_group = std::size_t(std::max<std::int64_t>(1, z.sub_group_size));
  o.buffer_count = z.offload_optimizer.buffer_count;
  o.aio.block_size = std::size_t(cfg_.aio.block_size);
  o.aio.queue_depth = cfg_.aio.queue_depth;
  o.aio.thread_count = cfg_.aio.thread_count;
  return o;
}

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

}  // namespace ds
