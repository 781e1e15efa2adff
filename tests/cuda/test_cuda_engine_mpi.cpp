// The engine on several GPUs -- one rank per GPU, GptCuda on each, gradients all-reduced over
// NCCL while backward runs, ZeRO-1's parameter gathers over NCCL -- against the engine on the
// CPU in one process with the whole global batch (a world-size-1 communicator), on every rank:
//   fp32 AdamW + clipping, ZeRO stages 0 and 1, 6 steps: the mean over ranks of the ranks'
//   micro-batch losses equals the reference loss to 1e-4 relative, the global grad norms to
//   1e-3, and the parameters stay within 3 x lr (Adam's update is lr x a sign-like term where
//   tiny gradients are summed in another order); every rank holds the same parameters.
//   bf16 stage 0: 20 steps on one global batch, the loss falls below 60% of the first.
// Needs at least two ranks and a GPU per local rank; exits 77 (skipped) otherwise -- on a
// one-GPU machine (NCCL refuses two ranks on one device) and everywhere in CI.
#include <cuda_runtime.h>
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "ds/engine/engine.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/init.h"
#include "ds/nn/gpt.h"
#include "ds/nn/gpt_cuda.h"
#include "engine_fixture.h"
#include "self_comm.h"

namespace {

using engine_test::config_text;
using engine_test::rows_of;
using engine_test::train_step;
ds::nn::GptConfig small() { return engine_test::small_gpt(); }
constexpr std::int64_t kMicro = 2;

// The global batch of step s: W * kMicro rows, the same on every rank.
std::vector<std::int32_t> global_tokens(int W, int s) { return engine_test::global_tokens(W, kMicro, s, 1000u); }

void fp32_matches_one_process(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& nccl, int stage) {
  const int W = ctx.world_size, r = ctx.rank;
  ds::nn::GptCuda model(small(), /*allow_tf32=*/false);
  auto gpu = ds::initialize(ds::config::parse_config_text(config_text(kMicro, stage), "test config"), model, ctx.comm,
                            nccl);
  ds::nn::Gpt ref_model(small());
  auto ref = ds::initialize(ds::config::parse_config_text(config_text(kMicro * W, 0), "reference config"), ref_model,
                            std::make_shared<ds::test::SelfComm>());
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < 6; ++s) {
    const auto g = global_tokens(W, s);
    const auto mine = rows_of(g, r * kMicro, kMicro), all = rows_of(g, 0, kMicro * W);
    double l = train_step(*gpu.engine, mine.batch());
    MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_DOUBLE, MPI_SUM, ctx.mpi_comm);
    l /= W;
    const double lr_ = train_step(*ref.engine, all.batch());
    worst_loss = std::max(worst_loss, std::fabs(l - lr_) / std::fabs(lr_));
    const double ng = gpu.engine->get_global_grad_norm(), nr = ref.engine->get_global_grad_norm();
    worst_norm = std::max(worst_norm, std::fabs(ng - nr) / nr);
  }
  const auto p = gpu.engine->gather_params_fp32(), pr = ref.engine->gather_params_fp32();
  double d = p.size() == pr.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < p.size() && i < pr.size(); ++i) d = std::max(d, double(std::fabs(p[i] - pr[i])));
  // Every rank must hold the same parameters (max - min over ranks of a checksum).
  double sum = 0;
  for (float x : p) sum += double(x);
  double lo = sum, hi = sum;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, ctx.mpi_comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, ctx.mpi_comm);
  if (r == 0)
    std::printf("fp32 ZeRO-%d on %d GPUs: worst relative loss difference %.2e, grad norm %.2e; max |param - "
                "reference| %.2e; parameter checksums across ranks %.17g .. %.17g\n",
                stage, W, worst_loss, worst_norm, d, lo, hi);
  CHECK_MSG(worst_loss <= 1e-4, "ZeRO-%d: losses differ from the one-process engine (%.2e)", stage, worst_loss);
  CHECK_MSG(worst_norm <= 1e-3, "ZeRO-%d: grad norms differ (%.2e)", stage, worst_norm);
  CHECK_MSG(d <= 3e-3, "ZeRO-%d: parameters diverged from the reference (%.2e)", stage, d);
  CHECK_MSG(lo == hi, "ZeRO-%d: ranks hold different parameters", stage);
}

void bf16_trains(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& nccl) {
  const int W = ctx.world_size, r = ctx.rank;
  ds::nn::GptCuda model(small());
  auto gpu = ds::initialize(
      ds::config::parse_config_text(config_text(kMicro, 0, engine_test::kBf16), "bf16 config"), model,
      ctx.comm, nccl);
  const auto g = global_tokens(W, 99);
  const auto mine = rows_of(g, r * kMicro, kMicro);
  double first = 0, last = 0;
  for (int s = 0; s < 20; ++s) {
    double l = train_step(*gpu.engine, mine.batch());
    MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_DOUBLE, MPI_SUM, ctx.mpi_comm);
    l /= W;
    if (s == 0) first = l;
    last = l;
  }
  if (r == 0) std::printf("bf16 on %d GPUs: mean loss %.4f -> %.4f over 20 steps\n", W, first, last);
  CHECK_MSG(last < 0.6 * first, "bf16: the loss did not fall (%.4f -> %.4f)", first, last);
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("test_cuda_engine_mpi: no CUDA device visible: skipped\n");
    return 77;
  }
  ds::DistributedContext ctx = ds::init_distributed();
  engine_test::g_rank = ctx.rank;
  int enough = devices >= ctx.local_size && ctx.world_size >= 2 ? 1 : 0, all = 0;
  MPI_Allreduce(&enough, &all, 1, MPI_INT, MPI_MIN, ctx.mpi_comm);
  if (!all) {
    if (ctx.rank == 0)
      std::printf("test_cuda_engine_mpi: %d ranks, %d GPUs for %d local ranks (needs >= 2 ranks, a GPU each): "
                  "skipped\n", ctx.world_size, devices, ctx.local_size);
    ds::finalize_distributed(ctx);
    return 77;
  }
  try {
    DS_CUDA_CHECK(cudaSetDevice(ctx.device));
    auto nccl = ds::make_communicator(ctx, "nccl");
    fp32_matches_one_process(ctx, nccl, 0);
    fp32_matches_one_process(ctx, nccl, 1);
    bf16_trains(ctx, nccl);
  } catch (const std::exception& e) {
    std::printf("FAIL rank %d: exception: %s\n", ctx.rank, e.what());
    ++engine_test::g_fail;
  }
  const int total = engine_test::failures_on_all_ranks(ctx);
  if (ctx.rank == 0) std::printf("test_cuda_engine_mpi: %s\n", total ? "FAILED" : "all checks passed");
  ds::finalize_distributed(ctx);
  return total ? 1 : 0;
}
