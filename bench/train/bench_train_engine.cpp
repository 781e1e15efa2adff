// Training throughput of the built-in GPT (or, --model llama, the Llama-style decoder of the
// same shape with n_head / 2 key/value heads, as bench_train) through the engine (ds::initialize, forward /
// backward / step with AdamW), on as many ranks as mpirun starts. Rank 0 prints one JSON
// line (cpu_ms_per_step: rank 0's process CPU time per step; cpu_ms_per_step_ranks: every
// rank's). bench/train/run.sh drives it beside PyTorch DDP.
//
// Checks: the loss (mean over ranks) is finite and falls, and every rank ends with the same
// parameters (a hash of each rank's copy). Headline: tokens/s over the compute bound measured
// in this run (every rank runs sgemm at n = 1024 at once, the rates summed, over the model's
// FLOPs per token); --min_ratio X fails the run below X. Rank 0's last stdout line is its
// JSON: record (bench/README.md).
//
//   mpirun -np 2 bench_train_engine [--model gpt|llama] [--dtype fp32|bf16] [--steps N] [--warmup N] [--batch 8]
//                                   [--min_ratio X]
#include <cblas.h>
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "ds/data/dataset.h"
#include "ds/data/sampler.h"
#include "ds/engine/engine.h"
#include "ds/mpi/init.h"
#include "ds/nn/gemm.h"
#include "ds/core/buffer.h"
#include "ds/core/cpu_features.h"
#include "ds/core/hash.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "bench_report.h"

namespace {

// sgemm GFLOP/s at n = 1024 (median of 5 after one warm-up), wall time.
double sgemm_gflops_1024() {
  const int n = 1024;
  ds::HostBuffer a(std::size_t(n) * n, ds::DType::F32), b(std::size_t(n) * n, ds::DType::F32), c(std::size_t(n) * n, ds::DType::F32);
  for (std::size_t i = 0; i < a.count(); ++i) {
    a.as<float>()[i] = float(i % 7) * 0.1f;
    b.as<float>()[i] = float(i % 5) * 0.1f;
  }
  std::vector<double> t;
  for (int r = 0; r < 6; ++r) {
    const double t0 = MPI_Wtime();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.as<float>(), n, b.as<float>(), n, 0.0f,
                c.as<float>(), n);
    if (r > 0) t.push_back(MPI_Wtime() - t0);
  }
  return 2.0 * n * n * n / ds::bench::median(t) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::string dtype = "fp32", model_type = "gpt";
    int steps = 20, warmup = 3;
    double min_ratio = 0;
    ds::nn::GptConfig cfg{4, 4, 256, 128, 256};
    std::int64_t B = 8;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
      if (a == "--dtype") dtype = next();
      else if (a == "--model") model_type = next();
      else if (a == "--steps") steps = std::stoi(next());
      else if (a == "--warmup") warmup = std::stoi(next());
      else if (a == "--batch") B = std::stoi(next());
      else if (a == "--layers") cfg.n_layer = std::stoi(next());
      else if (a == "--embd") cfg.n_embd = std::stoi(next());
      else if (a == "--min_ratio") min_ratio = ds::bench::parse_min_ratio("bench_train_engine", next());
      else { std::fprintf(stderr, "bench_train_engine: error: unknown flag %s\n", a.c_str()); return 2; }
    }
    if (model_type != "gpt" && model_type != "llama") {
      std::fprintf(stderr, "bench_train_engine: error: --model %s: expected gpt or llama\n", model_type.c_str());
      return 2;
    }
    const bool is_llama = model_type == "llama";
    ds::DistributedContext ctx = ds::init_distributed();
    std::unique_ptr<ds::nn::Gpt> gpt;
    std::unique_ptr<ds::nn::Llama> llama;
    if (is_llama) {
      ds::nn::LlamaConfig lc;
      lc.n_layer = cfg.n_layer;
      lc.n_head = cfg.n_head;
      lc.n_kv_head = std::max<std::int64_t>(1, cfg.n_head / 2);
      lc.n_embd = cfg.n_embd;
      lc.block_size = cfg.block_size;
      lc.vocab_size = cfg.vocab_size;
      llama = std::make_unique<ds::nn::Llama>(lc);
    } else {
      gpt = std::make_unique<ds::nn::Gpt>(cfg);
    }
    ds::Module& model = is_llama ? static_cast<ds::Module&>(*llama) : static_cast<ds::Module&>(*gpt);
    std::ostringstream js;
    js << R"({"train_micro_batch_size_per_gpu": )" << B
       << R"(, "gradient_accumulation_steps": 1, "steps_per_print": 1000000,)"
       << R"( "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}})"
       << (dtype == "bf16" ? R"(, "bf16": {"enabled": true})" : dtype == "fp16" ? R"(, "fp16": {"enabled": true})" : "")
       << "}";
    auto init = ds::initialize(js.str(), model, ctx.comm);
    auto& engine = *init.engine;
    auto data = ds::data::TextDataset::embedded();
    const std::int64_t T = cfg.block_size;
    ds::data::Loader loader(data, T,
                            ds::data::DistributedSampler(data.num_samples(T), ctx.world_size, ctx.rank,
                                                         std::size_t(B), true, 1, true));
    double t0 = 0, c0 = 0;
    auto cpu_now = [] {
      timespec ts;
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
      return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
    };
    float first = 0, loss = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup) {
        MPI_Barrier(ctx.mpi_comm);
        t0 = MPI_Wtime();
        c0 = cpu_now();
      }
      loss = engine.forward(loader.next());
      if (s == 0) first = loss;
      engine.backward(loss);
      engine.step();
    }
    const double dc = cpu_now() - c0;  // this rank's CPU time (all its threads), before the barrier
    MPI_Barrier(ctx.mpi_comm);
    const double dt = MPI_Wtime() - t0;
    const double tps = double(ctx.world_size) * double(B * T) * steps / dt;
    // Every rank's CPU time per step. Waits spent asleep are not in it; the shm barrier's
    // yield loop (a rank's progress thread waiting for the others) is.
    std::vector<double> cpu_ms(std::size_t(ctx.world_size));
    const double my_cpu_ms = 1e3 * dc / steps;
    MPI_Gather(&my_cpu_ms, 1, MPI_DOUBLE, cpu_ms.data(), 1, MPI_DOUBLE, 0, ctx.mpi_comm);
    const ds::nn::Precision prec = is_llama ? llama->gemm_precision() : gpt->gemm_precision();
    const char* gemm = prec == ds::nn::Precision::BF16 ? "own-bf16"
                       : ds::nn::own_f32_for_layers()                     ? "own-f32"
                                                                          : "openblas";
    if (ctx.rank == 0)
      std::printf("dstrain engine %s, %s, %d ranks x %d threads, kernel set %s: tokens/s %.0f (step %.1f ms), loss %.4f -> %.4f\n",
                  is_llama ? "Llama" : "GPT", dtype.c_str(), ctx.world_size, omp_get_max_threads(),
                  ds::isa_name(ds::cpu_isa()), tps, 1e3 * dt / steps, first, loss);
    // The checks: mean loss over ranks falls; every rank holds the same parameters.
    double losses[2] = {first, loss};
    MPI_Allreduce(MPI_IN_PLACE, losses, 2, MPI_DOUBLE, MPI_SUM, ctx.mpi_comm);
    const double mean_first = losses[0] / ctx.world_size, mean_last = losses[1] / ctx.world_size;
    const std::vector<float> params = engine.gather_params_fp32();
    const std::uint64_t h = ds::fnv1a64(params.data(), params.size() * sizeof(float));
    std::uint64_t hmin = h, hmax = h;
    MPI_Allreduce(MPI_IN_PLACE, &hmin, 1, MPI_UINT64_T, MPI_MIN, ctx.mpi_comm);
    MPI_Allreduce(MPI_IN_PLACE, &hmax, 1, MPI_UINT64_T, MPI_MAX, ctx.mpi_comm);
    // The bound: sgemm on every rank at once (as the training shares the cores), summed.
    MPI_Barrier(ctx.mpi_comm);
    double gf = sgemm_gflops_1024();
    MPI_Allreduce(MPI_IN_PLACE, &gf, 1, MPI_DOUBLE, MPI_SUM, ctx.mpi_comm);
    const double fpt = is_llama ? llama->flops_per_token(T) : gpt->flops_per_token(T), bound = gf * 1e9 / fpt;
    ds::bench::Report report("bench_train_engine");
    report.min_ratio(min_ratio);
    report["impl"] = "dstrain-engine";
    report["model"] = model_type;
    report["flops_per_token"] = fpt;
    report["dtype"] = dtype;
    report["ranks"] = ctx.world_size;
    report["threads"] = omp_get_max_threads();
    report["tokens_per_s"] = tps;
    report["step_ms"] = 1e3 * dt / steps;
    report["cpu_ms_per_step"] = 1e3 * dc / steps;
    report["cpu_ms_per_step_ranks"] = cpu_ms;
    report["loss_first"] = first;
    report["loss_last"] = loss;
    report["gemm"] = gemm;
    report["sgemm_gflops_1024_all_ranks"] = gf;
    report["bound_tokens_per_s"] = bound;
    report.check("the loss (mean over ranks) is finite and falls",
                 std::isfinite(mean_first) && std::isfinite(mean_last) && mean_last < mean_first,
                 "first " + std::to_string(mean_first) + ", last " + std::to_string(mean_last));
    report.check("every rank holds the same parameters", hmin == hmax,
                 std::to_string(params.size()) + " parameters, hashes " + (hmin == hmax ? "equal" : "differ"));
    report.headline("tokens/s (whole run) / compute bound (sgemm on every rank, measured here)", tps / bound);
    int code = report.finish(ctx.rank == 0);
    MPI_Bcast(&code, 1, MPI_INT, 0, ctx.mpi_comm);
    init.engine.reset();
    ds::finalize_distributed(ctx);
    return code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_engine: error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
