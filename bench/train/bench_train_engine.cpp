// Training throughput of the built-in GPT through the engine (ds::initialize, forward /
// backward / step with AdamW), on as many ranks as mpirun starts. Rank 0 prints one JSON
// line (cpu_ms_per_step: rank 0's process CPU time per step; cpu_ms_per_step_ranks: every
// rank's). bench/train/run.sh drives it beside PyTorch DDP.
//
//   mpirun -np 2 bench_train_engine [--dtype fp32|bf16] [--steps N] [--warmup N] [--batch 8]
#include <mpi.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <sstream>
#include <string>
#include <vector>

#include "ds/data/dataset.h"
#include "ds/data/sampler.h"
#include "ds/engine/engine.h"
#include "ds/mpi/init.h"
#include "ds/nn/gemm.h"
#include "ds/nn/gpt.h"

int main(int argc, char** argv) {
  try {
    std::string dtype = "fp32";
    int steps = 20, warmup = 3;
    ds::nn::GptConfig cfg{4, 4, 256, 128, 256};
    std::int64_t B = 8;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
      if (a == "--dtype") dtype = next();
      else if (a == "--steps") steps = std::stoi(next());
      else if (a == "--warmup") warmup = std::stoi(next());
      else if (a == "--batch") B = std::stoi(next());
      else if (a == "--layers") cfg.n_layer = std::stoi(next());
      else if (a == "--embd") cfg.n_embd = std::stoi(next());
      else { std::fprintf(stderr, "bench_train_engine: error: unknown flag %s\n", a.c_str()); return 2; }
    }
    ds::DistributedContext ctx = ds::init_distributed();
    ds::nn::Gpt model(cfg);
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
    std::string ranks_cpu;
    for (double v : cpu_ms) {
      char num[32];
      std::snprintf(num, sizeof num, "%s%.2f", ranks_cpu.empty() ? "" : ", ", v);
      ranks_cpu += num;
    }
    if (ctx.rank == 0)
      std::printf("{\"impl\": \"dstrain-engine\", \"dtype\": \"%s\", \"ranks\": %d, \"threads\": %d, "
                  "\"tokens_per_s\": %.1f, \"step_ms\": %.2f, \"cpu_ms_per_step\": %.2f, "
                  "\"cpu_ms_per_step_ranks\": [%s], \"loss_first\": %.4f, \"loss_last\": %.4f, "
                  "\"gemm\": \"%s\"}\n",
                  dtype.c_str(), ctx.world_size, omp_get_max_threads(), tps, 1e3 * dt / steps, 1e3 * dc / steps, ranks_cpu.c_str(), first, loss,
                  model.gemm_precision() == ds::nn::Precision::BF16 ? "own-bf16"
                  : ds::nn::own_f32_for_layers()                     ? "own-f32"
                                                                     : "openblas");
    init.engine.reset();
    ds::finalize_distributed(ctx);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_engine: error: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
