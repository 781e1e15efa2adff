// The engine with several ranks sharing ONE GPU: every rank's GptCuda on device 0, gradients
// (and ZeRO-1's parameter gathers) over StagedComm -- device buffers staged through pinned
// host memory over MPI, because NCCL refuses two ranks on one device -- against one process
// with the whole global batch (GptCuda on the same GPU, a world-size-1 communicator), on
// every rank. ZeRO stages 0, 1, 2 and 3 (the GPU path's stages), fp32 and bf16, AdamW + clipping,
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
// ZeRO-2 also on a 3.6M-parameter GPT (14 MB of fp32 gradients, 7 chunks of 2 MiB) with
// 1M-element buckets, fp32, once with 2 accumulation steps of one row each: there the device
// paged buffer really unmaps the chunks outside a rank's slice after each bucket and maps them
// again in the next backward (and the slice accumulates across micro-steps), same limits; its
// memory report gives the slice's chunks as the gradient bytes, fewer than the whole
// gradients, and after a step only those chunks are mapped. And ZeRO-2 against ZeRO-1 on the
// same ranks, model, buckets and rows (one accumulation step): equal bit for bit, losses, grad
// norms and parameters (the same sums of the same buckets, the same slice stepped).
// ZeRO-3 also on the 3.6M GPT with no persistent groups, small prefetch and live limits and 2
// accumulation steps, so every group's flat chunks are mapped for its use and given back
// behind the compute stream (DevicePartitionedParamStore), same limits; its memory report
// after a step: the gradients are this rank's fp32 piece alone (every flat gradient chunk given
// back), and without persistent groups the parameters too (the working piece alone).
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
#include <stdexcept>
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
#include "device_paged_buffer.h"
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

// One run against the reference: the ZeRO stage, bf16 or fp32, the model, the bucket size
// (0: the default, one bucket for these models) and the accumulation steps (each of
// kMicro / gas rows).
struct Case {
  int stage = 0;
  bool bf16 = false;
  ds::nn::GptConfig model = engine_test::small_gpt();
  std::int64_t bucket = 0;
  std::int64_t gas = 1;
  std::string zero_keys = "";  // more zero_optimization keys (stage 3), e.g. "\"stage3_max_live_parameters\": 1"
};

std::string config(std::int64_t micro, const Case& c) {
  std::string t = config_text(micro, c.stage, c.bf16 ? engine_test::kBf16 : "");
  auto replace = [&t](const std::string& from, const std::string& to) {
    const std::size_t at = t.find(from);
    if (at == std::string::npos) throw std::runtime_error("test config: no " + from + " in " + t);
    t.replace(at, from.size(), to);
  };
  std::string keys = c.zero_keys;
  if (c.bucket > 0) keys += (keys.empty() ? "" : ", ") + std::string("\"reduce_bucket_size\": ") + std::to_string(c.bucket);
  if (!keys.empty())
    replace("\"stage\": " + std::to_string(c.stage) + "}", "\"stage\": " + std::to_string(c.stage) + ", " + keys + "}");
  if (c.gas > 1) replace("\"gradient_accumulation_steps\": 1", "\"gradient_accumulation_steps\": " + std::to_string(c.gas));
  return t;
}

// About 3.6M parameters: 2 blocks of width 384 (head size 64), 7 chunks of fp32 gradients.
ds::nn::GptConfig chunky_gpt() {
  ds::nn::GptConfig g = engine_test::small_gpt();
  g.n_embd = 384;
  g.n_head = 6;
  return g;
}

// ZeRO-2: what the memory report and the gradient residency say after a step (es: bytes per
// gradient element).
void check_zero2_memory(const ds::Engine& e, const ds::nn::GptCuda& model, std::size_t es, const char* what,
                        int rank, int W) {
  std::size_t numel = 0;
  for (const auto& p : model.parameters()) numel += std::size_t(p.numel());
  const std::size_t whole = numel * es, chunk = ds::engine::DevicePagedBuffer::granularity(0);
  const auto rep = e.memory_report();
  const auto gm = e.gradient_memory();
  if (rank == 0)
    std::printf("%s: %zu gradient bytes mapped after the step (the slice's chunks %zu; %zu bytes of gradients, %zu "
                "reserved in %zu-byte chunks; most during a backward %zu; memory report grads %zu + buckets %zu)\n",
                what, gm.resident, gm.partition, whole, gm.reserved, chunk, gm.peak_resident, rep.grads,
                rep.grad_buckets);
  CHECK_MSG(gm.reserved >= whole && gm.partition > 0, "%s: reserved %zu, slice %zu", what, gm.reserved, gm.partition);
  CHECK_MSG(gm.resident == gm.partition, "%s: %zu gradient bytes mapped after the step, the slice's chunks are %zu",
            what, gm.resident, gm.partition);
  CHECK_MSG(rep.grads == gm.partition, "%s: the memory report's grads %zu are not the slice's chunks %zu", what,
            rep.grads, gm.partition);
  CHECK_MSG(gm.peak_resident >= gm.partition, "%s: peak %zu below the slice's %zu", what, gm.peak_resident,
            gm.partition);
  // A rank's share of the reservation (which holds the padded space) plus the two chunks its
  // ends may straddle, when that is less than the whole reservation: the rest was unmapped.
  const std::size_t share = (gm.reserved + std::size_t(W) - 1) / std::size_t(W) + 2 * chunk;
  if (share < gm.reserved)
    CHECK_MSG(gm.partition <= share, "%s: the slice keeps %zu bytes, more than its share and two chunks (%zu)", what,
              gm.partition, share);
}

// ZeRO-3: the memory report after a step (es: bytes per working element). The fp32 gradient
// piece and the master are partition_numel x 4 bytes each; every flat gradient chunk has been
// given back (released behind the compute stream, and the step's grad_stats synchronised it),
// so the gradients are the piece alone; without persistent groups no flat parameter chunk
// stays mapped either, so the parameters are the working piece alone.
void check_zero3_memory(const ds::Engine& e, const ds::nn::GptCuda& model, std::size_t es, bool none_persistent,
                        const char* what, int rank, int W) {
  std::size_t numel = 0;
  for (const auto& p : model.parameters()) numel += std::size_t(p.numel());
  const std::size_t groups = model.parameter_groups().empty() ? 1 : model.parameter_groups().size();
  const auto rep = e.memory_report();
  const std::size_t piece = rep.master / 4;  // partition_numel
  if (rank == 0)
    std::printf("%s: memory report after a step: params %zu, grads %zu, master %zu bytes (%zu parameters, %zu groups, "
                "%d ranks)\n",
                what, std::size_t(rep.params), std::size_t(rep.grads), std::size_t(rep.master), numel, groups, W);
  CHECK_MSG(piece * std::size_t(W) >= numel && piece * std::size_t(W) < numel + std::size_t(W) * groups,
            "%s: the master holds %zu elements, not this rank's share of %zu parameters in %zu groups", what, piece,
            numel, groups);
  CHECK_MSG(std::size_t(rep.grads) == piece * 4,
            "%s: the gradients take %zu bytes after a step, the fp32 piece alone is %zu (flat chunks still mapped)",
            what, std::size_t(rep.grads), piece * 4);
  CHECK_MSG(std::size_t(rep.params) >= piece * es, "%s: params %zu below the working piece %zu", what,
            std::size_t(rep.params), piece * es);
  if (none_persistent)
    CHECK_MSG(std::size_t(rep.params) == piece * es,
              "%s: the parameters take %zu bytes after a step, the working piece alone is %zu (flat chunks still "
              "mapped without persistent groups)",
              what, std::size_t(rep.params), piece * es);
}

void matches_one_process(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& staged, const Case& c) {
  const int W = ctx.world_size, r = ctx.rank;
  const int stage = c.stage;
  const bool bf16 = c.bf16;
  char dtype[64];
  std::snprintf(dtype, sizeof dtype, "%s%s%s%s", bf16 ? "bf16" : "fp32", c.model.n_embd > 32 ? " 3.6M GPT" : "",
                c.gas > 1 ? " gas 2" : "", c.zero_keys.empty() ? "" : " (limits)");
  ds::nn::GptCuda model(c.model, /*allow_tf32=*/false);
  auto gpu = ds::initialize(ds::config::parse_config_text(config(kMicro / c.gas, c), "test config"), model, ctx.comm,
                            staged);
  ds::nn::GptCuda ref_model(c.model, /*allow_tf32=*/false);
  Case ref_case = c;
  ref_case.stage = 0;
  ref_case.bucket = 0;
  ref_case.gas = 1;
  ref_case.zero_keys.clear();
  auto ref = ds::initialize(ds::config::parse_config_text(config(kMicro * W, ref_case), "reference config"), ref_model,
                            std::make_shared<ds::test::SelfComm>());
  double worst_loss = 0, worst_norm = 0;
  for (int s = 0; s < kSteps; ++s) {
    const auto g = engine_test::global_tokens(W, kMicro, s, 2000u);
    const auto all = rows_of(g, 0, kMicro * W);
    double l = 0;
    const std::int64_t rows = kMicro / c.gas;
    for (std::int64_t m = 0; m < c.gas; ++m) {
      const auto mine = rows_of(g, r * kMicro + m * rows, rows);
      l += train_step(*gpu.engine, mine.batch()) / double(c.gas);
    }
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
  if (stage == 2) {
    char what[96];
    std::snprintf(what, sizeof what, "%s ZeRO-2, %d ranks", dtype, W);
    check_zero2_memory(*gpu.engine, model, bf16 ? 2 : 4, what, r, W);
  }
  if (stage == 3) {
    char what[96];
    std::snprintf(what, sizeof what, "%s ZeRO-3, %d ranks", dtype, W);
    const bool none_persistent = c.zero_keys.find("\"stage3_param_persistence_threshold\": 0") != std::string::npos;
    check_zero3_memory(*gpu.engine, model, bf16 ? 2 : 4, none_persistent, what, r, W);
  }
}

// ZeRO-2 against ZeRO-1 on the same ranks, model (the 3.6M GPT), buckets and rows, one
// accumulation step: the buckets are reduced in the same order with the same sums, the same
// slice is stepped with the same gradients, so losses, grad norms and parameters must be
// equal bit for bit -- whatever the paging of the gradients does, it must not change a value.
void zero2_equals_zero1(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& staged) {
  const int W = ctx.world_size, r = ctx.rank;
  struct Run {
    std::vector<float> losses;
    std::vector<double> norms;
    std::vector<float> params;
  };
  // One engine at a time: the staged communicator orders its copies on the compute stream
  // the last engine built gave it (set_compute_stream), so two engines must not share it at once.
  auto train = [&](int stage) {
    Run out;
    const Case c{stage, false, chunky_gpt(), 1 << 20, 1, ""};
    ds::nn::GptCuda m(c.model, /*allow_tf32=*/false);
    auto e = ds::initialize(ds::config::parse_config_text(config(kMicro, c), "test config"), m, ctx.comm, staged);
    for (int s = 0; s < kSteps; ++s) {
      const auto g = engine_test::global_tokens(W, kMicro, s, 3000u);
      out.losses.push_back(train_step(*e.engine, rows_of(g, r * kMicro, kMicro).batch()));
      out.norms.push_back(e.engine->get_global_grad_norm());
    }
    out.params = e.engine->gather_params_fp32();
    return out;
  };
  const Run z1 = train(1), z2 = train(2);
  int differ = 0;
  for (int s = 0; s < kSteps; ++s) {
    if (z1.losses[std::size_t(s)] == z2.losses[std::size_t(s)] && z1.norms[std::size_t(s)] == z2.norms[std::size_t(s)])
      continue;
    ++differ;
    if (r == 0)
      std::printf("step %d: ZeRO-1 loss %.9g norm %.17g, ZeRO-2 loss %.9g norm %.17g\n", s, z1.losses[std::size_t(s)],
                  z1.norms[std::size_t(s)], z2.losses[std::size_t(s)], z2.norms[std::size_t(s)]);
  }
  std::size_t diff_params = z1.params.size() == z2.params.size() ? 0 : std::max(z1.params.size(), z2.params.size());
  for (std::size_t i = 0; i < z1.params.size() && i < z2.params.size(); ++i) diff_params += z1.params[i] != z2.params[i];
  if (r == 0)
    std::printf("fp32 3.6M GPT, %d ranks: ZeRO-2 vs ZeRO-1 with the same buckets: %d of %d steps differ, %zu of %zu "
                "parameters differ\n",
                W, differ, kSteps, diff_params, z1.params.size());
  CHECK_MSG(differ == 0, "ZeRO-2 and ZeRO-1 differ in loss or grad norm at %d steps", differ);
  CHECK_MSG(diff_params == 0, "ZeRO-2 and ZeRO-1 differ in %zu parameters", diff_params);
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
          for (int stage : {0, 1, 2, 3}) matches_one_process(ctx, staged, Case{stage, bf16});
        // ZeRO-2 where chunks really go and come back: 3.6M parameters, 1M-element buckets.
        matches_one_process(ctx, staged, Case{2, false, chunky_gpt(), 1 << 20, 1, ""});
        matches_one_process(ctx, staged, Case{2, false, chunky_gpt(), 1 << 20, 2, ""});
        zero2_equals_zero1(ctx, staged);
        // ZeRO-3 where every group's chunks go and come back: no persistent group, gathers at
        // most 1M elements ahead, at most 2M gathered (the deferred releases then wait for the
        // oldest), 2 accumulation steps (each micro-step's flat gradients released and mapped
        // zeroed again).
        const std::string limits =
            "\"stage3_param_persistence_threshold\": 0, \"stage3_prefetch_bucket_size\": 1000000, "
            "\"stage3_max_live_parameters\": 2000000";
        matches_one_process(ctx, staged, Case{3, false, chunky_gpt(), 1 << 20, 1, limits});
        matches_one_process(ctx, staged, Case{3, false, chunky_gpt(), 1 << 20, 2, limits});
        return engine_test::kChecksDone;  // staged, a local, is released before MPI finalizes
      });
}
