// ZeRO memory and step time (not a test): one ZeRO stage per process, so VmHWM is that
// stage's peak. bench/zero/run.sh runs stages 0-3 at 2 and 4 ranks and prints the table
// that docs/user/performance.md ("ZeRO memory and step time") holds. Stage 3 runs with
// DeepSpeed's stage-3 defaults unless --persistence / --prefetch / --reuse say otherwise, and
// also prints peak_live (the most parameter elements gathered at once, from the engine).
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
//
// Then, in the same process (after VmHWM is read), the reference: stage 0 from the same
// initial parameters on the same batches for the same steps. Checks: the stage's final
// parameters equal stage 0's within 4 ulps of the working dtype at magnitude 1 (fp32 1e-5; the
// partitioned gradient norm sums in another order, tests/engine has the same bounds), and
// every rank holds the same parameters. Headline: stage 0's median step time over this
// stage's (>1: faster than stage 0); --min_ratio X fails the run below X. The last line on
// rank 0 is its JSON: record (bench/README.md); --no_reference skips the reference run and
// the comparison (no headline then).
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/core/proc_status.h"
#include "ds/core/timer.h"
#include "ds/engine/engine.h"
#include "ds/engine/memory.h"
#include "ds/mpi/init.h"
#include "ds/core/hash.h"
#include "ds/nn/gpt.h"
#include "bench_report.h"

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

}  // namespace

int main(int argc, char** argv) {
  int stage = 0, steps = 8, warmup = 2;
  std::int64_t persistence = 100000, prefetch = 50000000, reuse = 1000000000;
  std::int64_t layers = 4, embd = 384, seq = 64, batch = 2, bucket = 2000000;
  std::string precision = "fp16";
  double min_ratio = 0;
  bool no_reference = false;
  CLI::App app{"ZeRO stage memory and step time"};
  app.add_option("--stage", stage, "ZeRO stage 0, 1, 2 or 3")->check(CLI::Range(0, 3));
  app.add_option("--persistence", persistence, "stage 3: stage3_param_persistence_threshold (elements)");
  app.add_option("--prefetch", prefetch, "stage 3: stage3_prefetch_bucket_size (elements)");
  app.add_option("--reuse", reuse, "stage 3: stage3_max_reuse_distance (elements)");
  app.add_option("--steps", steps, "timed optimizer steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--layers", layers);
  app.add_option("--embd", embd);
  app.add_option("--seq", seq);
  app.add_option("--batch", batch, "micro batch per rank");
  app.add_option("--bucket", bucket, "reduce_bucket_size (elements)");
  app.add_option("--precision", precision, "fp16 | bf16 | fp32");
  app.add_option("--min_ratio", min_ratio, "fail (exit 3) when stage 0's step time / this stage's is below this")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--no_reference", no_reference, "skip the stage-0 reference run (no comparison, no headline)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints the message (or the help)
    return code == 0 ? 0 : 2;      // bad arguments: 2, as every benchmark
  }
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
    auto config = [&](int st) {
      nlohmann::json cfg{{"train_micro_batch_size_per_gpu", batch},
                         {"gradient_accumulation_steps", 1},
                         {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-4}}}}},
                         {"zero_optimization", {{"stage", st}, {"reduce_bucket_size", bucket}}}};
      if (st == 3) {
        cfg["zero_optimization"]["stage3_param_persistence_threshold"] = persistence;
        cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = prefetch;
        cfg["zero_optimization"]["stage3_max_reuse_distance"] = reuse;
      }
      if (precision != "fp32") cfg[precision] = {{"enabled", true}};
      if (precision == "fp16") cfg["fp16"]["initial_scale_power"] = 12;
      return ds::config::parse_config_json(cfg);
    };
    auto r = ds::initialize(config(stage), model, comm);
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
    double bwd0 = 0, red0 = 0, wait0 = 0, gwait0 = 0;
    Usage u0;
    for (int i = 0; i < warmup + steps; ++i) {
      if (i == warmup) {
        bwd0 = e.timers().total_ms("backward");
        red0 = e.timers().total_ms("reduce");
        wait0 = e.timers().total_ms("bucket_wait");
        gwait0 = e.timers().total_ms("gather_wait");
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
    const double gather_wait = (e.timers().total_ms("gather_wait") - gwait0) / std::max(1, steps);
    double hwm = ds::peak_resident_mib().value_or(-1);  // -1: unreadable
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
          "formula_master=%zu formula_optim=%zu gather_wait_ms=%.2f skipped=%lld\n",
          stage, comm->size(), P, precision.c_str(), median, bwd, red, wait, faults, cpu, hwm, rep.params, rep.grads,
          rep.grad_buckets, gm.resident, rep.master,
          rep.optimizer_state, rep.comm_scratch, est.params, est.grads, est.master, est.optimizer_state, gather_wait,
          (long long)e.skipped_steps());
      std::fflush(stdout);
    }
    ds::bench::Report report("zero_bench");
    report.min_ratio(min_ratio);
    report["stage"] = stage;
    report["world"] = comm->size();
    report["params"] = P;
    report["precision"] = precision;
    report["step_ms"] = median;
    report["backward_ms"] = bwd;
    report["reduce_ms"] = red;
    report["wait_ms"] = wait;
    report["faults_per_step"] = faults;
    report["cpu_ms_per_step"] = cpu;
    report["vmhwm_mib"] = hwm;
    report["engine_bytes"] = {{"params", rep.params}, {"grads", rep.grads}, {"grad_buckets", rep.grad_buckets},
                              {"master", rep.master}, {"optimizer_state", rep.optimizer_state}, {"comm_scratch", rep.comm_scratch}};
    report["formula_bytes"] = {{"params", est.params}, {"grads", est.grads}, {"master", est.master},
                               {"optimizer_state", est.optimizer_state}};
    report["skipped_steps"] = (long long)e.skipped_steps();
    report["gather_wait_ms"] = gather_wait;
    // Ranks agree: each rank's full copy of the parameters hashes the same.
    const std::vector<float> params = e.gather_params_fp32();
    std::uint64_t h[2] = {ds::fnv1a64(params.data(), params.size() * sizeof(float)), 0};
    h[1] = ~h[0];  // max of h and max of ~h (= ~min of h): one all_reduce
    comm->all_reduce(ds::TensorView{h, 2, ds::DType::I64}, ds::ReduceOp::Max);
    report.check("every rank holds the same parameters", h[0] == ~h[1],
                 std::to_string(params.size()) + " parameters, hashes " + (h[0] == ~h[1] ? "equal" : "differ"));
    r.engine.reset();
    if (!no_reference) {
      // The reference: stage 0, fresh model (same seed, so the same initial parameters), the
      // same batches and steps, timed the same way.
      ds::nn::Gpt ref_model(gc);
      auto r0 = ds::initialize(config(0), ref_model, comm);
      auto& e0 = *r0.engine;
      std::vector<double> t0s;
      for (int i = 0; i < warmup + steps; ++i) {
        comm->barrier();
        ds::Stopwatch sw;
        float loss = e0.forward(bt);
        e0.backward(loss);
        e0.step();
        double ms = sw.elapsed_ms();
        comm->all_reduce(ds::TensorView{&ms, 1, ds::DType::F64}, ds::ReduceOp::Max);
        if (i >= warmup) t0s.push_back(ms);
      }
      std::sort(t0s.begin(), t0s.end());
      const double median0 = t0s.empty() ? 0 : t0s[t0s.size() / 2];
      const std::vector<float> ref = e0.gather_params_fp32();
      double worst = ref.size() == params.size() ? 0 : INFINITY;
      for (std::size_t i = 0; i < std::min(ref.size(), params.size()); ++i)
        worst = std::max(worst, double(std::fabs(ref[i] - params[i])));
      if (!std::isfinite(worst)) worst = INFINITY;  // NaN parameters count as different
      comm->all_reduce(ds::TensorView{&worst, 1, ds::DType::F64}, ds::ReduceOp::Max);
      const double tol = precision == "fp16" ? 4.0 / 1024 : precision == "bf16" ? 4.0 / 128 : 1e-5;
      char detail[160];
      std::snprintf(detail, sizeof detail, "largest |difference| %.3g over %zu parameters (limit %.3g), %d steps", worst,
                    params.size(), tol, warmup + steps);
      report.check("the final parameters equal stage 0's", worst <= tol, detail);
      report["stage0_step_ms"] = median0;
      report.headline("stage 0 step time / this stage's (medians)", median0 / median);
      if (comm->rank() == 0) std::printf("stage 0 reference: step_ms=%.2f vs_stage0=%.3f\n", median0, median0 / median);
      r0.engine.reset();
    }
    int code = report.finish(comm->rank() == 0);
    comm->broadcast(ds::TensorView{&code, 1, ds::DType::I32}, 0);
    comm.reset();
    ds::finalize_distributed(ctx);
    return code;
  } catch (const std::exception& ex) {
    ds::abort_job(1, std::string("zero_bench: error: ") + ex.what());
  }
  return 0;
}
