// run(): the collective half of the job, as named steps -- engine, resume, train (with
// validation and checkpoints), the 16-bit model save, the sample and the summary.
#include "train_loop.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <sstream>
#include <vector>

#include "ds/data/sampler.h"
#include "ds/engine/engine.h"
#include "ds/io/state_value.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/device_comm.h"
#include "ds/nn/gemm.h"
#include "ds/optim/optimizer.h"
#include "job.h"
#include "loaders.h"
#include "pipe_loop.h"
#include "report.h"
#include "resume.h"
#include "run_summary.h"
#include "sample.h"
#include "save_dir_check.h"

namespace ds::train {

namespace {
constexpr std::int64_t kLossWindow = 10;  // the summary's train loss: mean of the last steps

// kernels.cpu_bf16_gemm for a CPU decoder on bf16: "auto" times the bf16 and fp32 kernels on
// each rank (ds/nn/gemm.h) and the ranks take the minimum, so all run bf16 only when every
// rank measured it faster: the ranks compute the same numbers. Collective (every rank has the
// same config: the job fingerprints agreed). Returns what "auto" measured, for the log line.
std::string agree_cpu_bf16_gemm(const Job& j, Communicator& comm) {
  const nn::CpuBf16Gemm mode = nn::parse_cpu_bf16_gemm(j.cfg.kernels.cpu_bf16_gemm, "kernels.cpu_bf16_gemm");
  std::int32_t bf16 = nn::cpu_bf16_gemm_choice(mode) ? 1 : 0;
  const std::int32_t mine = bf16;
  comm.all_reduce(TensorView{&bf16, 1, DType::I32}, ReduceOp::Min);
  nn::set_cpu_bf16_gemm(bf16 == 1);
  if (mode != nn::CpuBf16Gemm::Auto) return {};
  const nn::Bf16GemmTiming& t = nn::measure_bf16_gemm();
  char buf[160];
  if (t.bf16_seconds > 0)
    std::snprintf(buf, sizeof buf, ": bf16 kernel %.2fx the fp32 one on rank 0, bf16 needs %.2fx%s",
                  t.f32_seconds / t.bf16_seconds, nn::kBf16GemmMinSpeedup,
                  mine != bf16 ? "; another rank measured less" : "");
  else
    std::snprintf(buf, sizeof buf, ": this CPU has no AVX512-BF16");
  return buf;
}

std::string bf16_gemm_line(const Job& j, const std::string& detail) {
  return std::string("Linear GEMMs ") +
         (nn::layer_precision(true) == nn::Precision::BF16 ? "in bf16 (vdpbf16ps, fp32 accumulation)"
                                                           : "in fp32 on bf16 parameters") +
         " (kernels.cpu_bf16_gemm " + j.cfg.kernels.cpu_bf16_gemm + detail + ")";
}

// Before the first step: every tag this run will save is free in --save_dir, and there is
// room for a checkpoint (rank 0 checks; an error ends the job through abort_job).
void check_save_room(const Job& j, const Engine& engine, std::int64_t start_step, int world_size) {
  SavePlan plan;
  plan.start_step = start_step;
  plan.total_steps = j.total_steps;
  plan.save_interval = j.opts.save_interval.value_or(0);
  const std::uint64_t numel = engine.partition_map().total_numel;
  const std::uint64_t flat_states = 1 + engine.optimizer()->state_tensors().size();  // fp32 master + optimizer
  plan.checkpoint_bytes = numel * dtype_size(engine.working_dtype()) + flat_states * numel * sizeof(float) +
                          (std::uint64_t(1) << 20) + std::uint64_t(world_size) * 65536;
  check_save_plan(j.opts.save_dir, plan);
}

// A resumed run with nothing left to do says so (rank 0).
void note_nothing_to_train(const Job& j, std::int64_t start_step, Reporter& rep) {
  if (start_step > j.total_steps) {
    // Likely a mistyped --steps: say so where warnings go, not only in the progress output.
    std::fflush(stdout);
    std::fprintf(stderr, "train: warning: the checkpoint is at step %lld, past this run's last step %lld "
                 "(--steps/--epochs): nothing to train, the checkpoint is left as it is\n",
                 static_cast<long long>(start_step), static_cast<long long>(j.total_steps));
    std::fflush(stderr);
  } else if (start_step == j.total_steps) {
    rep.note("nothing to train: the checkpoint is at step " + std::to_string(start_step) + ", the run's last step");
  }
}

// The loop's state: loaders, RNG, and the steps that use them (train, validate, save).
class Trainer {
 public:
  Trainer(const Job& j, Engine& engine, const DistributedContext& dist)
      : j_(j), engine_(engine), world_size_(dist.world_size), rng_(j.seed),
        train_loader_(make_train_loader(j)), val_loader_(make_val_loader(j)) {}

  data::DistributedSampler& train_sampler() { return train_loader_->sampler(); }
  std::mt19937_64& rng() { return rng_; }

  // Steps start_step + 1 .. total_steps: validation every eval_interval steps and at the end,
  // checkpoints every save_interval steps and at the end.
  FinalLosses train(std::int64_t start_step, Reporter& rep) {
    FinalLosses out;
    for (std::int64_t step = start_step + 1; step <= j_.total_steps; ++step) {
      StepRecord r = train_step(step);
      out.recent_train.push_back(r.loss);
      if (std::int64_t(out.recent_train.size()) > kLossWindow) out.recent_train.erase(out.recent_train.begin());
      const bool last = step == j_.total_steps;
      if (last || (j_.eval_interval > 0 && step % j_.eval_interval == 0)) {
        r.val_loss = validate();
        if (r.val_loss) engine_.log_eval_loss(*r.val_loss);
        if (last) out.validation = r.val_loss;
      }
      rep.step(r);
      const auto every = j_.opts.save_interval.value_or(0);
      if (!j_.opts.save_dir.empty() && (last || (every > 0 && step % every == 0))) save(step);
    }
    return out;
  }

 private:
  std::size_t micro_batch() const { return std::size_t(j_.cfg.train_micro_batch_size_per_gpu); }
  Batch to_model(const Batch& b) const { return j_.model.adapt_batch ? j_.model.adapt_batch(b) : b; }

  // Collective: mean over ranks of sum / count.
  double global_mean(double sum, double count) {
    double buf[2] = {sum, count};
    engine_.comm().all_reduce(TensorView{buf, 2, DType::F64}, ReduceOp::Sum);
    return buf[1] > 0 ? buf[0] / buf[1] : std::nan("");
  }

  StepRecord train_step(std::int64_t step) {
    const std::int64_t gas = j_.cfg.gradient_accumulation_steps;
    double loss_sum = 0;
    double lr = engine_.get_lr();
    for (std::int64_t micro = 0; micro < gas; ++micro) {
      Batch b = to_model(train_loader_->next());
      const float loss = engine_.forward(b);
      loss_sum += double(loss);
      engine_.backward(loss);
      if (micro + 1 == gas) lr = engine_.get_lr();
      engine_.step();
    }
    StepRecord r;
    r.step = step;
    r.loss = global_mean(loss_sum, double(gas));
    r.lr = lr;
    r.grad_norm = engine_.get_global_grad_norm();
    r.loss_scale = engine_.loss_scale();
    return r;
  }

  // Validation loss: the first eval_iters micro-batches of the validation split on every
  // rank (the same batches each time, so values are comparable), sample-weighted.
  std::optional<double> validate() {
    if (!val_loader_) return std::nullopt;
    val_loader_->sampler().set_state({});
    const auto iters = std::min<std::int64_t>(j_.eval_iters, std::int64_t(val_loader_->sampler().steps_per_epoch()));
    double sum = 0, count = 0;
    for (std::int64_t i = 0; i < iters; ++i) {
      Batch b = val_loader_->next();
      const double n = double(b.batch);
      sum += double(engine_.evaluate(to_model(b))) * n;
      count += n;
    }
    return global_mean(sum, count);
  }

  // The engine's checkpoint plus the client state a resume needs (see resume.h).
  void save(std::int64_t step) {
    const io::StateValue cs = train_client_state(j_, step, train_loader_->sampler(),
                                                 std::int64_t(micro_batch()) * world_size_, rng_);
    engine_.save_checkpoint(j_.opts.save_dir, "global_step" + std::to_string(step), cs);  // the engine reports it
  }

  const Job& j_;
  Engine& engine_;
  int world_size_;
  std::mt19937_64 rng_;
  std::unique_ptr<data::BatchLoader> train_loader_, val_loader_;
};

}  // namespace

void run(Job& j, DistributedContext& dist) {
  if (j.stages > 1) return run_pipelined(j, dist);
  const bool rank0 = dist.rank == 0;
  Communicator& comm = *dist.comm;

  // The engine's steps_per_print lines would tear the bar, so with the bar they are off --
  // on every rank, so that all engines run with the same config.
  std::int32_t bar_flag = j.bar ? 1 : 0;
  comm.broadcast(TensorView{&bar_flag, 1, DType::I32}, 0);
  if (bar_flag) j.cfg.steps_per_print.reset();

  // The GPU path reduces gradients over a device communicator of the same ranks: NCCL or
  // staged, by communication.device_backend and the rule in ds/mpi/device_comm.h.
  std::shared_ptr<Communicator> device_comm;
  if (j.on_gpu && dist.world_size > 1)
    device_comm = make_device_communicator(dist, j.cfg.communication.device_backend,
                                           j.opts.config + ": communication.device_backend");
  if (rank0 && j.on_gpu) std::printf("[train] device: %s\n", nn::gpu_device_name(j.device).c_str());
  const bool bf16_gemm = !j.on_gpu && j.model.cpu_bf16_gemm && j.cfg.bf16.enabled;
  const std::string bf16_detail = bf16_gemm ? agree_cpu_bf16_gemm(j, comm) : std::string();
  auto init = ds::initialize(j.cfg, *j.model.module, dist.comm, device_comm);
  Engine& engine = *init.engine;

  Trainer trainer(j, engine, dist);
  const std::int64_t start_step = resume(j, engine, trainer.train_sampler(), trainer.rng(), dist.world_size, rank0);
  if (rank0 && !j.opts.save_dir.empty()) check_save_room(j, engine, start_step, dist.world_size);
  if (rank0)
    print_run_header(j, engine, dist.world_size, start_step,
                     bf16_gemm && engine.working_dtype() == DType::BF16 ? bf16_gemm_line(j, bf16_detail) : "");

  Reporter rep(rank0, j.bar, start_step + 1, j.total_steps, engine.train_batch_size() * j.tokens_per_sample(),
               j.cfg.steps_per_print, j.opts.loss_csv);
  rep.set_unit(j.data_unit());
  if (rank0) note_nothing_to_train(j, start_step, rep);
  const FinalLosses losses = trainer.train(start_step, rep);
  rep.finish_bar();

  // zero_optimization.stage3_gather_16bit_weights_on_model_save: the final weights also as one
  // consolidated safetensors file beside the checkpoints (DeepSpeed's save_16bit_model).
  if (!j.opts.save_dir.empty() && j.cfg.zero_optimization.gather_16bit_weights_on_model_save &&
      j.total_steps > start_step)
    engine.save_16bit_model(j.opts.save_dir, "model.safetensors");
  if (j.model.generate && j.opts.sample_tokens > 0)
    print_sample(j, rank0 || engine.zero_stage() == 3, rank0, trainer.rng()());

  // With checkpoint.async_save the last save is still being written: commit it (collective)
  // before reporting success, or `latest` would name the previous tag. It prints the same
  // "saved checkpoint" line as a synchronous save.
  engine.wait_for_checkpoint();
  print_summary(j, engine, rep, start_step, losses, rank0);
  // comms_logger: rank 0's collectives, as DeepSpeed's log_summary() prints them.
  if (const std::string comms = engine.comms_summary(); rank0 && !comms.empty())
    std::printf("[train] comms_logger summary (rank 0):\n%s", comms.c_str());
}

}  // namespace ds::train
