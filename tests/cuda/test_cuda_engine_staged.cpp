// The engine with several ranks sharing ONE GPU: every rank's GptCuda on device 0, gradients
// (and ZeRO-1's parameter gathers) over StagedComm -- device buffers staged through pinned
// host memory over MPI, because NCCL refuses two ranks on one device -- against one process
// with the whole global batch (GptCuda on the same GPU, a world-size-1 communicator), on
// every rank. ZeRO stages 0 and 1 (the GPU path's stages), fp32 and bf16, AdamW + clipping,
// 6 steps, each rank training on its rows of the global batch:
//   fp32: the mean over ranks of the ranks' losses equals the reference loss to 1e-4
//         relative, the global grad norm to 1e-3, the parameters within 3 x lr (as the NCCL
//         test: Adam's update is lr x a sign-like term where tiny gradients are summed in
//         another order).
//   bf16: losses to 2e-2 relative and grad norms to 5e-2 (bf16 gradients of half batches,
//         summed with a rounding per addition, against the whole batch's), the parameters
//         within 12 x lr plus one bf16 unit in the last place of the value (Adam moves a
//         parameter by about lr per step at most, so two runs part by at most 2 x lr a step;
//         the working parameters are the master rounded to bf16).
//   Every rank holds the same parameters, bit for bit.
// Also the device communicator rule on the live job: "staged" builds a StagedComm; "auto"
// takes staged when the node's ranks outnumber its GPUs.
// Before the device check, on any machine: without a GPU, make_device_communicator refuses
// "nccl" naming the key and "auto" ends in StagedComm's "no CUDA device visible", on every
// rank together (no hang); then exit 77 (skipped). Needs >= 2 ranks (registered at 2 and 4).
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
#include "ds/mpi/device_comm.h"
#include "ds/mpi/init.h"
#include "ds/nn/gpt_cuda.h"
#include "engine_fixture.h"
#include "self_comm.h"

namespace {

using engine_test::bf16_ulp;
using engine_test::config_text;
using engine_test::rows_of;
using engine_test::train_step;
constexpr std::int64_t kMicro = 2;
constexpr double kLr = 0.001;
constexpr int kSteps = 6;

std::string config(std::int64_t micro, int stage, bool bf16) {
  return config_text(micro, stage, bf16 ? engine_test::kBf16 : "");
}

void matches_one_process(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& staged, int stage,
                         bool bf16) {
  const int W = ctx.world_size, r = ctx.rank;
  const char* dtype = bf16 ? "bf16" : "fp32";
  ds::nn::GptCuda model(engine_test::small_gpt(), /*allow_tf32=*/false);
  auto gpu = ds::initialize(ds::config::parse_config_text(config(kMicro, stage, bf16), "test config"), model,
                            ctx.comm, staged);
  ds::nn::GptCuda ref_model(engine_test::small_gpt(), /*allow_tf32=*/false);
  auto ref = ds::initialize(ds::config::parse_config_text(config(kMicro * W, 0, bf16), "reference config"), ref_model,
                            std::make_shared<ds::test::SelfComm>());
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < kSteps; ++s) {
    const auto g = engine_test::global_tokens(W, kMicro, s, 2000u);
    const auto mine = rows_of(g, r * kMicro, kMicro), all = rows_of(g, 0, kMicro * W);
    double l = train_step(*gpu.engine, mine.batch());
    MPI_Allreduce(MPI_IN_PLACE, &l, 1, MPI_DOUBLE, MPI_SUM, ctx.mpi_comm);
    l /= W;
    const double lr_ = train_step(*ref.engine, all.batch());
    worst_loss = std::max(worst_loss, std::fabs(l - lr_) / std::fabs(lr_));
    const double ng = gpu.engine->get_global_grad_norm(), nr = ref.engine->get_global_grad_norm();
    worst_norm = std::max(worst_norm, std::fabs(ng - nr) / nr);
  }
  // Parameters: the worst ratio of |difference| to its allowance (<= 1 passes).
  const double lr_allow = (bf16 ? 12 : 3) * kLr;
  const auto p = gpu.engine->gather_params_fp32(), pr = ref.engine->gather_params_fp32();
  double worst_param = p.size() == pr.size() && !p.empty() ? 0 : INFINITY, worst_abs = 0;
  for (std::size_t i = 0; i < p.size() && i < pr.size(); ++i) {
    const double d = std::fabs(double(p[i]) - double(pr[i]));
    const double allow = lr_allow + (bf16 ? bf16_ulp(std::max(std::fabs(p[i]), std::fabs(pr[i]))) : 0.0);
    worst_param = std::max(worst_param, d / allow);
    worst_abs = std::max(worst_abs, d);
  }
  // Every rank must hold the same parameters (max - min over ranks of a checksum).
  double sum = 0;
  for (float x : p) sum += double(x);
  double lo = sum, hi = sum;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_DOUBLE, MPI_MIN, ctx.mpi_comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_DOUBLE, MPI_MAX, ctx.mpi_comm);
  const double loss_tol = bf16 ? 2e-2 : 1e-4, norm_tol = bf16 ? 5e-2 : 1e-3;
  if (r == 0)
    std::printf("%s ZeRO-%d, %d ranks on one GPU (staged): worst relative loss difference %.2e (limit %.0e), grad "
                "norm %.2e (limit %.0e); max |param - reference| %.2e (%.2f of its allowance); parameter checksums "
                "across ranks %.17g .. %.17g\n",
                dtype, stage, W, worst_loss, loss_tol, worst_norm, norm_tol, worst_abs, worst_param, lo, hi);
  CHECK_MSG(worst_loss <= loss_tol, "%s ZeRO-%d: losses differ from the one-process engine (%.2e)", dtype, stage,
            worst_loss);
  CHECK_MSG(worst_norm <= norm_tol, "%s ZeRO-%d: grad norms differ (%.2e)", dtype, stage, worst_norm);
  CHECK_MSG(worst_param <= 1, "%s ZeRO-%d: parameters diverged from the reference (max %.2e, %.2f of the allowance)",
            dtype, stage, worst_abs, worst_param);
  CHECK_MSG(lo == hi, "%s ZeRO-%d: ranks hold different parameters", dtype, stage);
}

// make_device_communicator(ctx, backend) on every rank; the error text, or "" when it built one.
std::string error_of(ds::DistributedContext& ctx, const char* backend) {
  try {
    ds::make_device_communicator(ctx, backend, "test: communication.device_backend");
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

// No GPU: the rule's refusals, collectively, then 77.
int without_device(ds::DistributedContext& ctx) {
  const std::string nccl = error_of(ctx, "nccl"), autod = error_of(ctx, "auto");
  const bool nccl_named = nccl.find("test: communication.device_backend \"nccl\": ") != std::string::npos;
  const bool auto_named = autod.find("StagedComm: no CUDA device visible") != std::string::npos;
  CHECK_MSG(nccl_named, "\"nccl\" without a GPU: %s", nccl.empty() ? "<no error>" : nccl.c_str());
  CHECK_MSG(auto_named, "\"auto\" without a GPU: %s", autod.empty() ? "<no error>" : autod.c_str());
  const int total = engine_test::failures_on_all_ranks(ctx);
  if (ctx.rank == 0) {
    std::printf("test_cuda_engine_staged: without a GPU, \"nccl\" is refused: %s\n", nccl.c_str());
    std::printf("test_cuda_engine_staged: no CUDA device visible: %s\n", total ? "FAILED" : "skipped");
  }
  return total ? 1 : 77;
}

}  // namespace

int main(int argc, char**) {
  return engine_test::mpi_test_main(
      argc, "test_cuda_engine_staged", "mpirun -np 2|4 test_cuda_engine_staged (no arguments)",
      [](ds::DistributedContext& ctx, int devices, cudaError_t rc) {
        if (rc != cudaSuccess || devices == 0) return without_device(ctx);
        if (ctx.world_size < 2) {
          std::printf("test_cuda_engine_staged: needs >= 2 ranks (mpirun -np 2): skipped\n");
          return 77;
        }
        {
          // auto on this job: staged exactly when a node's ranks outnumber its GPUs (here all
          // ranks run on one node, as ctest starts them).
          auto chosen = ds::make_device_communicator(ctx, "auto");
          const bool share = ctx.local_size > devices;
          if (share || ds::backend_info().nccl_compiled)
            CHECK_MSG(std::string(chosen->backend()) == (share ? "staged" : "nccl"),
                      "auto chose %s with %d local ranks, %d GPUs", std::string(chosen->backend()).c_str(),
                      ctx.local_size, devices);
        }
        // Every rank on GPU 0, whatever the machine has: the sharing case under test.
        ctx.device = 0;
        DS_CUDA_CHECK(cudaSetDevice(0));
        auto staged = ds::make_device_communicator(ctx, "staged");
        CHECK_MSG(std::string(staged->backend()) == "staged" && ctx.device == 0, "\"staged\" built %s on device %d",
                  std::string(staged->backend()).c_str(), ctx.device);
        for (bool bf16 : {false, true})
          for (int stage : {0, 1}) matches_one_process(ctx, staged, stage, bf16);
        return engine_test::kChecksDone;  // staged, a local, is released before MPI finalizes
      });
}
