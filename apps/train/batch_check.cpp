#include "batch_check.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "ds/core/error.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/nn/mlp.h"

namespace ds::train {

namespace {

std::string size_text(double bytes) {
  char b[64];
  if (bytes >= double(1ull << 40))
    std::snprintf(b, sizeof b, "%.1f TiB", bytes / double(1ull << 40));
  else if (bytes >= double(1ull << 30))
    std::snprintf(b, sizeof b, "%.1f GiB", bytes / double(1ull << 30));
  else
    std::snprintf(b, sizeof b, "%.1f MiB", bytes / double(1ull << 20));
  return b;
}

// The activation arena the built-in CPU models allocate for B sequences of T tokens; the MLP
// also reads a one-hot feature row per sequence (block_size x vocab floats, train's batcher).
double activation_bytes(const Module& model, std::int64_t B, std::int64_t T, double* features) {
  *features = 0;
  if (const auto* gpt = dynamic_cast<const nn::Gpt*>(&model)) return double(gpt->activation_bytes(B, T));
  if (const auto* llama = dynamic_cast<const nn::Llama*>(&model)) return double(llama->activation_bytes(B, T));
  if (const auto* mlp = dynamic_cast<const nn::Mlp*>(&model)) {
    *features = double(B) * double(mlp->config().in_features) * sizeof(float);
    return double(mlp->activation_bytes(B));
  }
  return 0;  // a model this check does not know: its activations are not counted
}

DType working_dtype(const config::DsConfig& cfg) {
  return cfg.fp16.enabled ? DType::F16 : cfg.bf16.enabled ? DType::BF16 : DType::F32;
}

// The ZeRO paper's model states of this rank, less what lives elsewhere: on the GPU path the
// parameters and gradients (and the master and optimizer state unless offloaded to the CPU);
// with NVMe offload the master and optimizer state (offload_optimizer) and the stage-3
// parameter partition (offload_param).
engine::ModelStateBytes host_model_states(const config::DsConfig& cfg, std::size_t num_params, const BatchPlan& plan) {
  const optim::OptimizerParams opt = cfg.optimizer.value_or(optim::OptimizerParams{});
  const std::size_t k = engine::optimizer_state_bytes_per_param(opt.type, opt.momentum != 0);
  const auto& z = cfg.zero_optimization;
  engine::ModelStateBytes s =
      engine::estimate_model_states_bytes(num_params, plan.world_size, z.stage, working_dtype(cfg), k);
  if (plan.on_gpu) {
    s.params = s.grads = 0;
    if (z.offload_optimizer.device != "cpu") s.master = s.optimizer_state = 0;
  }
  if (z.offload_optimizer.nvme()) s.master = s.optimizer_state = 0;
  if (z.offload_param.nvme() && z.stage == 3) s.params = 0;
  return s;
}

}  // namespace

std::int64_t BatchPlan::sequences_per_micro_batch() const {
  const auto per_rank = std::int64_t((train_samples + std::size_t(world_size) - 1) / std::size_t(world_size));
  return std::min(micro_batch, per_rank);
}

std::string micro_batch_repeat_warning(const BatchPlan& plan) {
  const std::int64_t share = plan.sequences_per_micro_batch();
  if (share >= plan.micro_batch) return "";
  std::ostringstream os;
  os << "train_micro_batch_size_per_gpu " << plan.micro_batch << " is more than the " << share
     << " training windows each rank gets (" << plan.data_name << " gives " << plan.train_samples
     << " windows of block_size+1 = " << plan.seq + 1 << " tokens for " << plan.world_size
     << " rank(s)): every micro-batch holds those " << share
     << " windows, so each micro-step is a whole epoch and sees the same data again; lower "
        "train_micro_batch_size_per_gpu to at most "
     << share << " or give more data";
  return os.str();
}

double WorkingSet::total() const { return activations + batch_buffers + double(states.total()); }

std::string WorkingSet::describe() const {
  std::ostringstream os;
  os << "activations " << size_text(activations) << ", micro-batch buffers " << size_text(batch_buffers)
     << ", parameters " << size_text(double(states.params)) << ", gradients " << size_text(double(states.grads))
     << ", fp32 master " << size_text(double(states.master)) << ", optimizer state "
     << size_text(double(states.optimizer_state));
  return os.str();
}

WorkingSet estimate_working_set(const config::DsConfig& cfg, const Module& model, const BatchPlan& plan) {
  WorkingSet w;
  std::size_t num_params = 0;
  for (const auto& p : model.parameters()) num_params += p.numel();
  w.states = host_model_states(cfg, num_params, plan);
  // The loader's buffers hold a full micro-batch however little data there is.
  w.batch_buffers = double(plan.micro_batch) * double(plan.seq) * 2 * sizeof(std::int32_t);
  if (!plan.on_gpu) {
    double features = 0;
    w.activations = activation_bytes(model, plan.sequences_per_micro_batch(), plan.seq, &features);
    w.batch_buffers += features;
  }
  return w;
}

void check_working_set(const WorkingSet& need, const BatchPlan& plan, const HostMemory& available) {
  const double here = need.total() * double(plan.ranks_here);
  if (here <= double(available.bytes)) return;
  std::ostringstream os;
  os << "train_micro_batch_size_per_gpu " << plan.micro_batch << ": training needs about "
     << size_text(need.total()) << " of host memory per rank (" << need.describe() << "; micro-batches of "
     << plan.sequences_per_micro_batch() << " sequences x " << plan.seq << " tokens)";
  if (plan.ranks_here > 1) os << ", x " << plan.ranks_here << " ranks on this machine = " << size_text(here);
  os << ", more than the " << size_text(double(available.bytes)) << " available (" << available.source
     << "); lower train_micro_batch_size_per_gpu, or train a smaller model, at a higher ZeRO stage or on more "
        "machines";
  DS_THROW(os.str());
}

void check_micro_batch(const config::DsConfig& cfg, const Module& model, const BatchPlan& plan, bool print_warning) {
  if (const std::string w = micro_batch_repeat_warning(plan); !w.empty() && print_warning) {
    std::fflush(stdout);
    std::fprintf(stderr, "train: warning: %s\n", w.c_str());
    std::fflush(stderr);
  }
  if (const auto available = available_host_memory())
    check_working_set(estimate_working_set(cfg, model, plan), plan, *available);
}

}  // namespace ds::train
