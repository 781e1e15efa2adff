// ZeRO memory and step time (not a test): one ZeRO stage per process, so VmHWM is that
// stage's peak. bench/zero/run.sh runs stages 0/1/2 at 2 and 4 ranks and prints the table
// that docs/user/performance.md ("ZeRO memory and step time") holds.
//
// Prints one line on rank 0, key=value pairs:
//   stage world params step_ms (median of the timed steps, max over ranks per step)
//   backward_ms reduce_ms (rank 0's engine timers, mean over the timed steps), wait_ms (of
//   backward_ms: ZeRO-2 waits for a bucket's reduction before launching another), faults
//   (rank 0's minor page faults per step), cpu_ms (rank 0's user + system CPU time per step)
//   vmhwm_mib (max over ranks), engine_{params,grads,master,optim,scratch}_bytes (rank 0),
//   engine_grad_buckets (ZeRO-2: peak gradient bytes resident beyond the partition during
//   backward), grad_resident (mincore of the gradient buffer after the last step, rank 0),
//   formula_{params,grads,master,optim}_bytes (ZeRO paper, estimate_model_states_bytes)
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/core/timer.h"
#include "ds/engine/engine.h"
#include "ds/engine/memory.h"
#include "ds/mpi/init.h"
#include "ds/nn/gpt.h"

namespace {

struct Usage {
  double cpu_ms = 0;
  long minflt = 0;
};
Usage usage() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  Usage u;
  u.cpu_ms = (double(ru.ru_utime.tv_sec) + double(ru.ru_stime.tv_sec)) * 1e3 +
             (double(ru.ru_utime.tv_usec) + double(ru.ru_stime.tv_usec)) * 1e-3;
  u.minflt = ru.ru_minflt;
  return u;
}

double vm_hwm_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;  // kB
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  int stage = 0, steps = 8, warmup = 2;
  std::int64_t layers = 4, embd = 384, seq = 64, batch = 2, bucket = 2000000;
  std::string precision = "fp16";
  CLI::App app{"ZeRO stage memory and step time"};
  app.add_option("--stage", stage, "ZeRO stage 0, 1 or 2");
  app.add_option("--steps", steps, "timed optimizer steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--layers", layers);
  app.add_option("--embd", embd);
  app.add_option("--seq", seq);
  app.add_option("--batch", batch, "micro batch per rank");
  app.add_option("--bucket", bucket, "reduce_bucket_size (elements)");
  app.add_option("--precision", precision, "fp16 | bf16 | fp32");
  CLI11_PARSE(app, argc, argv);
  try {
    auto ctx = ds::init_distributed();
    auto comm = ctx.comm;
    ds::nn::GptConfig gc;
    gc.n_layer = layers;
    gc.n_embd = embd;
    gc.n_head = 4;
    gc.block_size = seq;
    gc.vocab_size = 256;
    ds::nn::Gpt model(gc);
    nlohmann::json cfg{{"train_micro_batch_size_per_gpu", batch},
                       {"gradient_accumulation_steps", 1},
                       {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                       {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", bucket}}}};
    if (precision != "fp32") cfg[precision] = {{"enabled", true}};
    if (precision == "fp16") cfg["fp16"]["initial_scale_power"] = 12;
    auto r = ds::initialize(ds::config::parse_config_json(cfg), model, comm);
    auto& e = *r.engine;

    std::vector<std::int32_t> tokens(std::size_t(batch * (seq + 1)));
    std::uint64_t s = 1234 + std::uint64_t(comm->rank());
    for (auto& t : tokens) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      t = std::int32_t((s >> 33) % 256);
    }
    std::vector<std::int32_t> in(std::size_t(batch * seq)), tg(std::size_t(batch * seq));
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t t = 0; t < seq; ++t) {
        in[std::size_t(b * seq + t)] = tokens[std::size_t(b * (seq + 1) + t)];
        tg[std::size_t(b * seq + t)] = tokens[std::size_t(b * (seq + 1) + t + 1)];
      }
    ds::Batch bt;
    bt.inputs = in;
    bt.targets = tg;
    bt.batch = batch;
    bt.seq = seq;

    std::vector<double> times;
    double bwd0 = 0, red0 = 0, wait0 = 0;
    Usage u0;
    for (int i = 0; i < warmup + steps; ++i) {
      if (i == warmup) {
        bwd0 = e.timers().total_ms("backward");
        red0 = e.timers().total_ms("reduce");
        wait0 = e.timers().total_ms("bucket_wait");
        u0 = usage();
      }
      comm->barrier();
      ds::Stopwatch sw;
      float loss = e.forward(bt);
      e.backward(loss);
      e.step();
      double ms = sw.elapsed_ms();
      comm->all_reduce(ds::TensorView{&ms, 1, ds::DType::F64}, ds::ReduceOp::Max);
      if (i >= warmup) times.push_back(ms);
    }
    std::sort(times.begin(), times.end());
    const double median = times.empty() ? 0 : times[times.size() / 2];
    double hwm = vm_hwm_mib();
    comm->all_reduce(ds::TensorView{&hwm, 1, ds::DType::F64}, ds::ReduceOp::Max);
    const double bwd = (e.timers().total_ms("backward") - bwd0) / std::max(1, steps);
    const double red = (e.timers().total_ms("reduce") - red0) / std::max(1, steps);
    const double wait = (e.timers().total_ms("bucket_wait") - wait0) / std::max(1, steps);
    const Usage u1 = usage();
    const double cpu = (u1.cpu_ms - u0.cpu_ms) / std::max(1, steps);
    const double faults = double(u1.minflt - u0.minflt) / std::max(1, steps);
    const auto rep = e.memory_report();
    const auto gm = e.gradient_memory();
    const std::size_t P = e.partition_map().total_numel;
    const auto est = ds::engine::estimate_model_states_bytes(P, comm->size(), stage, e.working_dtype(),
                                                            ds::engine::optimizer_state_bytes_per_param("adamw"));
    if (comm->rank() == 0) {
      std::printf(
          "stage=%d world=%d params=%zu precision=%s step_ms=%.2f backward_ms=%.2f reduce_ms=%.2f wait_ms=%.2f "
          "faults=%.0f cpu_ms=%.1f vmhwm_mib=%.1f "
          "engine_params=%zu engine_grads=%zu engine_grad_buckets=%zu grad_resident=%zu "
          "engine_master=%zu engine_optim=%zu engine_scratch=%zu formula_params=%zu formula_grads=%zu "
          "formula_master=%zu formula_optim=%zu skipped=%lld\n",
          stage, comm->size(), P, precision.c_str(), median, bwd, red, wait, faults, cpu, hwm, rep.params, rep.grads,
          rep.grad_buckets, gm.resident, rep.master,
          rep.optimizer_state, rep.comm_scratch, est.params, est.grads, est.master, est.optimizer_state,
          (long long)e.skipped_steps());
      std::fflush(stdout);
    }
    r.engine.reset();
    comm.reset();
    ds::finalize_distributed(ctx);
  } catch (const std::exception& ex) {
    ds::abort_job(1, std::string("zero_bench: error: ") + ex.what());
  }
  return 0;
}
