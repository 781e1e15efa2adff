#include "run_summary.h"

#include <cstdio>

#include "ds/core/proc_status.h"
#include "ds/optim/optimizer.h"

namespace ds::train {

void print_run_header(const Job& j, const Engine& engine, int world_size, std::int64_t start_step,
                      const std::string& bf16_gemm_line) {
  std::size_t params = 0;
  for (const auto& p : j.model.module->parameters()) params += p.numel();
  std::printf("[train] model: %s (%zu parameters)\n", j.spec.describe().c_str(), params);
  if (!j.init_from_note.empty()) std::printf("[train] init: %s\n", j.init_from_note.c_str());
  if (j.model.checkpointing_note)
    std::printf("[train] activation checkpointing: %s\n", j.model.checkpointing_note().c_str());
  if (!bf16_gemm_line.empty()) std::printf("[train] bf16: %s\n", bf16_gemm_line.c_str());
  const bool features = j.feature_data();
  std::printf("[train] data: %s: %zu training / %zu validation %s, %lld optimizer steps per epoch\n",
              j.opts.data.empty() ? "embedded corpus" : j.opts.data.c_str(),
              features ? j.train_samples() : j.train_src().size(), features ? j.val_samples() : j.val_src().size(),
              j.data_unit(), static_cast<long long>(j.steps_per_epoch));
  if (!j.shards_note.empty()) std::printf("[train] token data: %s\n", j.shards_note.c_str());
  if (features) std::printf("[train] arrays: %s\n", j.train_arrays->describe().c_str());
  const std::string per_sample = features ? std::string("samples") : "sequences of " + std::to_string(j.spec.block_size) + " tokens";
  std::printf("[train] %d rank(s) x micro-batch %lld x %lld accumulation = %lld %s per step; steps %lld-%lld, seed %llu\n",
              world_size, static_cast<long long>(j.cfg.train_micro_batch_size_per_gpu),
              static_cast<long long>(j.cfg.gradient_accumulation_steps),
              static_cast<long long>(engine.train_batch_size()), per_sample.c_str(),
              static_cast<long long>(start_step + 1), static_cast<long long>(j.total_steps),
              static_cast<unsigned long long>(j.seed));
  std::fflush(stdout);
}

void print_summary(const Job& j, Engine& engine, const Reporter& rep, std::int64_t start_step,
                   const FinalLosses& losses, bool rank0) {
  // Peak resident memory of the ranks (VmHWM): the largest, for the summary.
  double peak_mib = ds::peak_resident_mib().value_or(0);  // 0 where unreadable
  engine.comm().all_reduce(TensorView{&peak_mib, 1, DType::F64}, ReduceOp::Max);
  if (!rank0) return;
  const std::int64_t done = rep.steps_done();
  const double tps = rep.tokens_per_s();
  const std::int64_t tokens_per_step = engine.train_batch_size() * j.tokens_per_sample();
  if (done > 0)
    std::printf("[train] done: %lld steps (%lld-%lld) in %.1f s, %lld %s, %.0f %s/s",
                static_cast<long long>(done), static_cast<long long>(start_step + 1),
                static_cast<long long>(j.total_steps), rep.elapsed_s(), static_cast<long long>(done * tokens_per_step),
                j.data_unit(), tps, j.data_unit());
  else
    std::printf("[train] done: 0 steps");
  if (done > 0 && j.model.flops_per_token > 0) std::printf(", %.1f GFLOP/s", tps * j.model.flops_per_token / 1e9);
  std::printf("\n");
  if (!losses.recent_train.empty()) {
    double m = 0;
    for (double x : losses.recent_train) m += x;
    std::printf("[train] final train loss %.4f (mean of the last %zu steps)", m / double(losses.recent_train.size()),
                losses.recent_train.size());
    if (losses.validation) std::printf(", final validation loss %.4f", *losses.validation);
    std::printf("\n");
  }
  std::printf("[train] memory per rank: model states %.1f MiB (ZeRO stage %d), peak resident %.1f MiB (largest rank)\n",
              double(engine.memory_report().total()) / (1 << 20), engine.zero_stage(), peak_mib);
  std::fflush(stdout);
}

}  // namespace ds::train
