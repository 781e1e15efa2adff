// What the engine tests under MPI share (test_cuda_engine_mpi.cpp: one GPU per rank over
// NCCL; test_cuda_engine_staged.cpp: ranks sharing GPU 0 over StagedComm;
// test_cuda_offload.cpp: ZeRO-Offload against the device optimizer): the failed-check counter
// and CHECK_MSG (a failure line names its rank), the global batch of a step and a rank's rows
// of it, the config text they train with, and one bf16 ulp.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "ds/mpi/init.h"
#include "engine_test_model.h"
#include "tokens.h"

namespace engine_test {

inline int g_fail = 0;  // this rank's failed checks
inline int g_rank = 0;  // printed in the failure lines

// The failed checks of all ranks together (collective: every rank calls it).
inline int failures_on_all_ranks(const ds::DistributedContext& ctx) {
  int total = 0;
  MPI_Allreduce(&g_fail, &total, 1, MPI_INT, MPI_SUM, ctx.mpi_comm);
  return total;
}

// What a test body returns to have mpi_test_main sum the failed checks of all ranks and end
// with 1 (any failed) or 0, saying "FAILED" / "all checks passed" on rank 0.
inline constexpr int kChecksDone = -1;

// The main() of a test that takes no arguments (else it prints `usage` and returns 2): counts
// the visible CUDA devices before MPI starts (a failed count leaves its error in rc, cleared
// from CUDA's state), starts MPI and runs body(ctx, devices, rc) on every rank. The body
// returns the exit code (77: skipped, after saying why) or kChecksDone; MPI is finalized here
// either way. An exception ends the whole job with `prog: error: <what>`.
template <typename Body>
int mpi_test_main(int argc, const char* prog, const char* usage, Body&& body) {
  if (argc != 1) {
    std::fprintf(stderr, "usage: %s\n", usage);
    return 2;
  }
  int devices = 0;
  const cudaError_t rc = cudaGetDeviceCount(&devices);
  if (rc != cudaSuccess) cudaGetLastError();
  int code = 0;
  try {
    ds::DistributedContext ctx = ds::init_distributed();
    g_rank = ctx.rank;
    code = body(ctx, devices, rc);
    if (code == kChecksDone) {
      const int total = failures_on_all_ranks(ctx);
      if (ctx.rank == 0) std::printf("%s: %s\n", prog, total ? "FAILED" : "all checks passed");
      code = total ? 1 : 0;
    }
    ds::finalize_distributed(ctx);
  } catch (const std::exception& e) {
    ds::abort_job(1, std::string(prog) + ": error: " + e.what());
  }
  return code;
}

// The global batch of step s: W * micro rows of kT + 1 tokens drawn by mt19937(seed + s), the
// same on every rank.
inline std::vector<std::int32_t> global_tokens(int W, std::int64_t micro, int s, unsigned seed) {
  std::mt19937 rng(seed + unsigned(s));
  std::uniform_int_distribution<std::int32_t> u(0, kMaxToken);
  std::vector<std::int32_t> t(std::size_t(W * micro * (kT + 1)));
  for (auto& x : t) x = u(rng);
  return t;
}

// Rows [row0, row0 + rows) of a global batch (each row kT inputs, targets shifted by one).
inline cuda_test::Tokens rows_of(const std::vector<std::int32_t>& g, std::int64_t row0, std::int64_t rows) {
  cuda_test::Tokens r;
  r.B = rows;
  r.T = kT;
  for (std::int64_t i = row0; i < row0 + rows; ++i) {
    const std::int32_t* p = g.data() + i * (kT + 1);
    r.in.insert(r.in.end(), p, p + kT);
    r.tg.insert(r.tg.end(), p + 1, p + kT + 1);
  }
  return r;
}

inline constexpr const char* kAdamW =
    R"({"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.99], "weight_decay": 0.01}})";
inline constexpr const char* kBf16 = R"(, "bf16": {"enabled": true})";

// The config the tests train with: micro-batch `micro`, one accumulation step, seed 5,
// clipping 0.5, `optimizer` (its JSON), ZeRO `stage`; extra: more top-level keys, each
// starting with a comma.
inline std::string config_text(std::int64_t micro, int stage, const std::string& extra = "",
                               const std::string& optimizer = kAdamW) {
  return "{\"train_micro_batch_size_per_gpu\": " + std::to_string(micro) +
         ", \"gradient_accumulation_steps\": 1, \"seed\": 5, \"gradient_clipping\": 0.5, \"optimizer\": " +
         optimizer + ", \"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}" + extra + "}";
}

// One bf16 unit in the last place of x (8 significant bits).
inline double bf16_ulp(double x) { return x == 0 ? 0 : std::ldexp(1.0, std::ilogb(x) - 7); }

}  // namespace engine_test

// Counts a failed check on this rank and says which (printf-style message).
#define CHECK_MSG(cond, ...)                                                 \
  do {                                                                       \
    if (!(cond)) {                                                           \
      ++engine_test::g_fail;                                                 \
      std::printf("FAIL rank %d line %d: ", engine_test::g_rank, __LINE__); \
      std::printf(__VA_ARGS__);                                              \
      std::printf("\n");                                                     \
    }                                                                        \
  } while (0)
