// run_pipelined (pipe_loop.h): the loop of train_loop.cpp over PipeEngine::train_batch, which
// runs a whole optimizer step (gradient_accumulation_steps micro-batches through the pipe),
// with resume and checkpoints of the whole model (loadable on any grid).
#include "pipe_loop.h"

#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "ds/data/sampler.h"
#include "ds/pipe/pipe_engine.h"
#include "loaders.h"
#include "report.h"
#include "resume.h"
#include "run_summary.h"
#include "sample.h"

namespace ds::train {

namespace {

constexpr std::int64_t kLossWindow = 10;  // the summary's train loss: mean of the last steps

// Validation through the pipe: the first eval_iters micro-batches of the validation split
// (the same ones each time), their mean loss over micro-batches and data-parallel ranks.
std::optional<double> validate(const Job& j, pipe::PipeEngine& pipe, data::BatchLoader* val) {
  if (!val) return std::nullopt;
  val->sampler().set_state({});
  const auto iters = std::min<std::int64_t>(j.eval_iters, std::int64_t(val->sampler().steps_per_epoch()));
  if (iters <= 0) return std::nullopt;
  return double(pipe.eval_batch([&] { return val->next(); }, int(iters)));
}

// The sample: the stages' weights gathered on rank 0 into the whole model prepare() built
// (unused by the pipe: its instances are others), in fp32, which rank 0 samples alone.
void sample_on_rank0(Job& j, pipe::PipeEngine& pipe, bool rank0, std::uint64_t seed) {
  std::vector<float> whole = pipe.gather_model_fp32();  // collective
  if (!rank0) return;
  std::vector<TensorView> params, grads;
  HostBuffer grad_storage(whole.size(), DType::F32);
  std::size_t at = 0;
  for (const ParamInfo& p : j.model.module->parameters()) {
    params.push_back(TensorView{whole.data() + at, p.numel(), DType::F32});
    grads.push_back(TensorView{grad_storage.as<float>() + at, p.numel(), DType::F32});
    at += p.numel();
  }
  j.model.module->bind(params, grads);
  print_sample(j, true, true, seed);
}

}  // namespace

void run_pipelined(Job& j, DistributedContext& dist) {
  const bool rank0 = dist.rank == 0;
  std::int32_t bar_flag = j.bar ? 1 : 0;  // the engine's progress lines would tear the bar
  dist.comm->broadcast(TensorView{&bar_flag, 1, DType::I32}, 0);
  if (bar_flag) j.cfg.steps_per_print.reset();

  // One instance per pipe buffer, built as prepare() built j.model (which the header reads).
  const pipe::ModelFactory instances = [&] { return j.build_another().module; };
  // --init_from: the model prepare() built reads the file (each stage keeps its share).
  pipe::PipeEngine pipe(j.cfg, instances, dist.mpi_comm, j.opts.init_from.empty() ? nullptr : j.model.module.get());
  Engine& engine = pipe.engine();
  // The pipe's micro-batches come from its data index's loaders: every stage of a pipe reads
  // the same ones (the first stage uses the inputs, the last the targets).
  auto train = make_train_loader(j);
  auto val = make_val_loader(j);

  std::mt19937_64 rng(j.seed);
  const std::int64_t start_step =
      resume(j, engine, train->sampler(), rng, j.dp_size, rank0,
             [&](const std::string& dir, std::optional<std::string> tag, const LoadOptions& o) {
               return pipe.load_checkpoint(dir, std::move(tag), o);
             });
  if (rank0) {
    print_run_header(j, engine, j.dp_size, start_step, "");  // the batch arithmetic is per data-parallel rank
    std::printf("[train] pipeline: %d stages x %d data-parallel rank(s), %lld micro-batches per step; %s\n", j.stages,
                j.dp_size, static_cast<long long>(j.cfg.gradient_accumulation_steps), pipe.describe_stages().c_str());
  }
  Reporter rep(rank0, j.bar, start_step + 1, j.total_steps, engine.train_batch_size() * j.tokens_per_sample(), j.cfg.steps_per_print,
               j.opts.loss_csv);
  rep.set_unit(j.data_unit());
  FinalLosses losses;
  const std::int64_t save_every = j.opts.save_interval.value_or(0);
  for (std::int64_t step = start_step + 1; step <= j.total_steps; ++step) {
    StepRecord r;
    r.step = step;
    r.lr = engine.get_lr();  // the rate this step's update applies
    r.loss = pipe.train_batch([&] { return train->next(); });
    r.grad_norm = engine.get_global_grad_norm();
    r.loss_scale = engine.loss_scale();
    losses.recent_train.push_back(r.loss);
    if (std::int64_t(losses.recent_train.size()) > kLossWindow) losses.recent_train.erase(losses.recent_train.begin());
    const bool last = step == j.total_steps;
    if (last || (j.eval_interval > 0 && step % j.eval_interval == 0)) {
      r.val_loss = validate(j, pipe, val.get());
      if (r.val_loss) engine.log_eval_loss(*r.val_loss);
      if (last) losses.validation = r.val_loss;
    }
    rep.step(r);
    if (!j.opts.save_dir.empty() && (last || (save_every > 0 && step % save_every == 0)))
      pipe.save_checkpoint(j.opts.save_dir, "global_step" + std::to_string(step),
                           train_client_state(j, step, train->sampler(),
                                              j.cfg.train_micro_batch_size_per_gpu * std::int64_t(j.dp_size), rng));
  }
  rep.finish_bar();
  engine.wait_for_checkpoint();  // checkpoint.async_save: commit the last save (collective)
  if (j.model.generate && j.opts.sample_tokens > 0) sample_on_rank0(j, pipe, rank0, rng());
  print_summary(j, engine, rep, start_step, losses, rank0);
}

}  // namespace ds::train
