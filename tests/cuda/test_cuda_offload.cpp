// ZeRO-Offload on the GPU path (zero_optimization.offload_optimizer.device "cpu"): the
// engine with the fp32 master and the optimizer state in host memory, stepped by the CPU
// kernels (OffloadDeviceParamStore), against the same engine with everything on the device
// (DeviceParamStore, CUDA kernels). A GPT of about 3.6M parameters, so that the copies run
// in several sub-groups (sub_group_size 1: the 4 MiB minimum per piece, 4 pieces in fp32,
// 2 in bf16). ZeRO stage 1, AdamW + WarmupLR + clipping, 6 steps; each rank trains on its rows
// of the global batch.
//   Adam: the CPU and CUDA kernels compute the same fp32 operations (cuda.optim_precision_kernels
//   checks them bitwise) on the same gradients and the same clip coefficient, so the losses
//   and parameters should agree bit for bit; the limits allow 4 fp32 ulps of the loss and,
//   for the parameters, 1e-6 (fp32) or one bf16 ulp of the value (bf16).
//   SGD with Nesterov momentum (fp32): the same, bitwise kernels, the same limits. (Lamb is
//   refused with ZeRO, so it never meets offload; HostOffloadStep's Lamb branch is tested on
//   the CPU.)
//   bf16 AdamW once more with pin_memory false (pageable host buffers).
//   At world size 1 also: checkpoints from the offloaded engine load into the device engine
//   and back, parameters and optimizer state equal bit for bit, one more step equal; the
//   memory report says the optimizer is offloaded and counts the host master.
// Registered at 1 rank and at 2 ranks sharing GPU 0 over StagedComm (as
// cuda.engine_staged_np2). Before the device check, on any machine: every config it trains
// with passes the config rules. Exit: 0 pass, 1 failure, 77 no GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include "ds/config/parse.h"
#include "ds/config/validate.h"
#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "ds/engine/engine.h"
#include "ds/engine/memory.h"
#include "ds/mpi/device_comm.h"
#include "ds/mpi/init.h"
#include "ds/nn/gpt_cuda.h"
#include "ds/optim/optimizer.h"
#include "engine_fixture.h"

namespace fs = std::filesystem;

namespace {

using engine_test::bf16_ulp;
using engine_test::rows_of;
using engine_test::train_step;
constexpr std::int64_t kMicro = 2;
constexpr int kSteps = 6;

// About 3.6M parameters: 2 blocks of width 384.
ds::nn::GptConfig model_config() {
  ds::nn::GptConfig g = engine_test::small_gpt();
  g.n_embd = 384;
  g.n_head = 6;  // head size 64, as GPT-2
  return g;
}

bool g_pin = true;  // offload_optimizer.pin_memory of the offloaded runs

ds::config::DsConfig config(bool offload, bool bf16, const char* optimizer) {
  const std::string opt = std::string(optimizer) == "sgd"
      ? R"({"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 0.01}})"
      : engine_test::kAdamW;
  const std::string extra = std::string(R"(, "scheduler": {"type": "WarmupLR", "params": )"
                                        R"({"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 3}})") +
                            (bf16 ? engine_test::kBf16 : "");
  ds::config::DsConfig c =
      ds::config::parse_config_text(engine_test::config_text(kMicro, 1, extra, opt), "test config");
  if (offload) {  // set on the struct: independent of how the parser reads the section
    c.zero_optimization.offload_optimizer.device = "cpu";
    c.zero_optimization.sub_group_size = 1;  // the minimum piece: several sub-groups
    c.zero_optimization.offload_optimizer.pin_memory = g_pin;
  }
  return c;
}

struct Run {
  std::vector<float> losses, params;
  std::vector<std::vector<float>> state;
};

std::vector<std::vector<float>> states(ds::Engine& e) {
  std::vector<std::vector<float>> out;
  e.optimizer()->download_state();
  for (auto& [name, span] : e.optimizer()->state_tensors()) out.emplace_back(span.begin(), span.end());
  return out;
}

Run train(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& device_comm, bool offload, bool bf16,
          const char* optimizer, const fs::path& save_to = {}) {
  ds::nn::GptCuda model(model_config(), /*allow_tf32=*/false);
  auto r = ds::initialize(config(offload, bf16, optimizer), model, ctx.comm, device_comm);
  CHECK_MSG(r.engine->device() == ds::Device::Cuda, "the engine did not take the GPU path");
  const auto mem = r.engine->memory_report();
  CHECK_MSG(mem.optimizer_offloaded == offload, "memory report: optimizer_offloaded %d, expected %d",
            int(mem.optimizer_offloaded), int(offload));
  Run out;
  for (int s = 0; s < kSteps; ++s) {
    const auto g = engine_test::global_tokens(ctx.world_size, kMicro, s, 3000u);
    out.losses.push_back(train_step(*r.engine, rows_of(g, ctx.rank * kMicro, kMicro).batch()));
  }
  out.params = r.engine->gather_params_fp32();
  out.state = states(*r.engine);
  if (!save_to.empty()) r.engine->save_checkpoint(save_to.string(), std::string(offload ? "offload" : "device"));
  return out;
}

void compare(ds::DistributedContext& ctx, const std::shared_ptr<ds::Communicator>& dc, bool bf16,
             const char* optimizer) {
  const char* dtype = bf16 ? "bf16" : "fp32";
  const Run dev = train(ctx, dc, false, bf16, optimizer), off = train(ctx, dc, true, bf16, optimizer);
  double worst_loss = 0, worst_param = 0;
  bool bitwise = dev.params == off.params && dev.losses == off.losses;
  for (int s = 0; s < kSteps; ++s)
    worst_loss = std::max(worst_loss, std::fabs(double(dev.losses[std::size_t(s)]) - off.losses[std::size_t(s)]) /
                                          std::fabs(double(dev.losses[std::size_t(s)])));
  CHECK_MSG(dev.params.size() == off.params.size(), "%s %s: parameter counts differ", dtype, optimizer);
  for (std::size_t i = 0; i < dev.params.size() && i < off.params.size(); ++i) {
    const double d = std::fabs(double(dev.params[i]) - off.params[i]);
    const double allow = bf16 ? bf16_ulp(std::max(std::fabs(dev.params[i]), std::fabs(off.params[i]))) : 1e-6;
    worst_param = std::max(worst_param, allow > 0 ? d / allow : (d > 0 ? INFINITY : 0));
  }
  const double loss_tol = 4 * 1.2e-7;
  std::printf("rank %d, %d ranks, %s %s ZeRO-1: offloaded (%s host buffers) vs device optimizer: worst relative "
              "loss difference %.2e (limit %.1e), worst parameter difference %.2f of its allowance%s\n",
              ctx.rank, ctx.world_size, dtype, optimizer, g_pin ? "pinned" : "pageable", worst_loss, loss_tol,
              worst_param,
              bitwise ? " (bit for bit)" : "");
  CHECK_MSG(worst_loss <= loss_tol, "%s %s: offloaded losses differ (%.2e)", dtype, optimizer, worst_loss);
  CHECK_MSG(worst_param <= 1, "%s %s: offloaded parameters differ (%.2f of the allowance)", dtype, optimizer,
            worst_param);
}

// On any machine, before the device check: every config the GPU runs use passes the config
// rules for this world size (a rule refusing one would otherwise show only on a GPU).
void configs_pass_the_rules(int world) {
  for (bool offload : {false, true})
    for (bool bf16 : {false, true})
      for (const char* opt : {"adamw", "sgd"})
        for (bool pin : {true, false}) {
          g_pin = pin;
          try {
            ds::config::DsConfig c = config(offload, bf16, opt);
            ds::config::resolve_batch_sizes(c, world);
            ds::config::validate(c, world);
          } catch (const ds::Error& e) {
            CHECK_MSG(false, "config (offload %d, bf16 %d, %s) refused: %s", int(offload), int(bf16), opt, e.what());
          }
        }
  g_pin = true;
}

// World size 1: checkpoints both ways between the offloaded and the device engine.
void checkpoints(ds::DistributedContext& ctx, const fs::path& dir) {
  const Run off = train(ctx, nullptr, true, false, "adamw", dir);
  const Run dev = train(ctx, nullptr, false, false, "adamw", dir);
  for (const bool into_offload : {false, true}) {
    const char* from = into_offload ? "device" : "offload";
    const Run& src = into_offload ? dev : off;
    ds::nn::GptCuda model(model_config(), false);
    auto r = ds::initialize(config(into_offload, false, "adamw"), model, ctx.comm);
    r.engine->load_checkpoint(dir.string(), std::string(from));
    const bool params_eq = r.engine->gather_params_fp32() == src.params, state_eq = states(*r.engine) == src.state;
    std::printf("checkpoint %s -> %s engine: parameters %s, optimizer state %s\n", from,
                into_offload ? "offloaded" : "device", params_eq ? "equal" : "DIFFER", state_eq ? "equal" : "DIFFER");
    CHECK_MSG(params_eq && state_eq, "checkpoint %s -> other engine: not bit-exact", from);
  }
}

}  // namespace

int main(int argc, char**) {
  return engine_test::mpi_test_main(
      argc, "test_cuda_offload", "[mpirun -np 1|2] test_cuda_offload (no arguments)",
      [](ds::DistributedContext& ctx, int devices, cudaError_t rc) {
        configs_pass_the_rules(ctx.world_size);
        if (rc != cudaSuccess || devices == 0) {
          const int total = engine_test::failures_on_all_ranks(ctx);
          if (ctx.rank == 0)
            std::printf("test_cuda_offload: the configs pass the config rules: %s; no CUDA device visible (%s): %s\n",
                        total ? "NO" : "yes", rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices",
                        total ? "FAILED" : "skipped");
          return total ? 1 : 77;
        }
        ctx.device = 0;  // every rank on GPU 0, as cuda.engine_staged_np2
        DS_CUDA_CHECK(cudaSetDevice(0));
        std::shared_ptr<ds::Communicator> staged;
        if (ctx.world_size > 1) staged = ds::make_device_communicator(ctx, "staged");
        for (bool bf16 : {false, true}) compare(ctx, staged, bf16, "adamw");
        compare(ctx, staged, false, "sgd");
        g_pin = false;  // pageable gradient copy and staging buffer
        compare(ctx, staged, true, "adamw");
        g_pin = true;
        if (ctx.world_size == 1) {
          const fs::path dir = fs::temp_directory_path() / ("ds_cuda_offload_" + std::to_string(::getpid()));
          checkpoints(ctx, dir);
          std::error_code ec;
          fs::remove_all(dir, ec);
        }
        return engine_test::kChecksDone;  // staged, a local, is released before MPI finalizes
      });
}
