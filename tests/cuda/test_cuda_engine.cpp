// The Engine on the GPU path (GptCuda, device storage, CUDA optimizer) against the same
// Engine on the CPU (Gpt, host storage, CPU optimizer), and checkpoints moving between them.
//   1. fp32, AdamW + WarmupLR + clipping: 6 steps on the same batches; the losses agree to
//      1e-4 relative at every step, the parameters to a few lr (Adam's update is lr x sign-
//      like for tiny gradients, where summation order flips it), and the norm to 1e-3.
//   2. GPU save -> CPU load: parameters, fp32 master and Adam state equal bit for bit; CPU
//      save -> GPU load likewise; one more step on both agrees.
//   3. bf16 AdamW: 25 steps on one batch, the loss falls below 60% of the first; SGD
//      (Nesterov momentum) and Adagrad in fp32: 8 steps with the CPU engine's losses (1e-4).
//   4. fp16 with initial scale 2^30: the first steps overflow and are skipped on the device
//      path exactly as DeepSpeed's scaler says (scale halves each time), then the loss falls.
//   5. ZeRO-3 on one GPU (DevicePartitionedParamStore at world size 1: gathers as device
//      copies, the fold reading the flat gradients) against ZeRO-3 on the CPU, fp32, no
//      persistent group: losses 1e-4 relative, grad norms 1e-3, parameters 3 x lr; a GPU
//      stage-3 checkpoint loads into the CPU stage-3 engine with the same parameters bit for
//      bit; the memory report after a step holds the pieces only.
//   6. ZeRO stage 3 on the GPU path with offload_param is refused with a message naming the
//      key (stages 2 and 3 with several ranks are tests/cuda/test_cuda_engine_staged.cpp).
// Exit: 0 pass, 1 failure, 77 no GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "cuda_test_util.h"
#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/engine/engine.h"
#include "ds/nn/gpt.h"
#include "ds/nn/gpt_cuda.h"
#include "ds/optim/optimizer.h"
#include "engine_test_model.h"
#include "self_comm.h"

namespace fs = std::filesystem;
using cuda_test::g_failures;

namespace {

#define CHECK_MSG(cond, ...)                      \
  do {                                            \
    if (!(cond)) {                                \
      std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
      std::printf(__VA_ARGS__);                   \
      std::printf("\n");                          \
      ++g_failures;                               \
    }                                             \
  } while (0)

using engine_test::kMaxToken;
using engine_test::kT;
using engine_test::train_step;
ds::nn::GptConfig small() { return engine_test::small_gpt(); }
constexpr std::int64_t kB = 4;

struct Batches {
  std::vector<std::vector<std::int32_t>> tok;
  explicit Batches(int n, unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<std::int32_t> u(0, kMaxToken);
    tok.assign(std::size_t(n), std::vector<std::int32_t>(kB * kT + 1));
    for (auto& t : tok)
      for (auto& x : t) x = u(rng);
  }
  ds::Batch get(std::size_t i) const {
    const auto& t = tok[i % tok.size()];
    ds::Batch b;
    b.inputs = std::span<const std::int32_t>(t.data(), kB * kT);
    b.targets = std::span<const std::int32_t>(t.data() + 1, kB * kT);
    b.batch = kB;
    b.seq = kT;
    return b;
  }
};

// extra: more top-level keys (starting with a comma); optimizer/scheduler: "" for the defaults
// of case 1 (AdamW lr 1e-3 with a 3-step WarmupLR), else the JSON of the key.
std::string config(const std::string& extra, const std::string& optimizer = "", const std::string& scheduler = "") {
  const std::string opt = optimizer.empty()
      ? R"({"type": "AdamW", "params": {"lr": 0.001, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.01}})"
      : optimizer;
  const std::string sch = scheduler.empty()
      ? R"({"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001, "warmup_num_steps": 3}})"
      : scheduler;
  std::string c = R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1, "seed": 5,
    "gradient_clipping": 0.5, "optimizer": )" + opt;
  if (sch != "none") c += R"(, "scheduler": )" + sch;
  return c + extra + "}";
}
const char* kAdamFast = R"({"type": "AdamW", "params": {"lr": 0.003, "betas": [0.9, 0.99], "eps": 1e-8, "weight_decay": 0.0}})";

ds::InitResult make(ds::Module& m, const std::string& cfg) {
  return ds::initialize(ds::config::parse_config_text(cfg, "test config"), m, std::make_shared<ds::test::SelfComm>());
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

// The optimizer state as host vectors (the GPU engine's host copies are current after a save).
std::vector<std::vector<float>> states(ds::Engine& e) {
  std::vector<std::vector<float>> out;
  e.optimizer()->download_state();
  for (auto& [name, span] : e.optimizer()->state_tensors()) out.emplace_back(span.begin(), span.end());
  return out;
}

void test_fp32_matches_cpu_and_checkpoints(const fs::path& dir) {
  const Batches data(3, 11);
  ds::nn::Gpt cpu_model(small());
  ds::nn::GptCuda gpu_model(small(), /*allow_tf32=*/false);
  auto cpu = make(cpu_model, config(""));
  auto gpu = make(gpu_model, config(""));
  CHECK_MSG(gpu.engine->device() == ds::Device::Cuda, "the engine did not take the GPU path");
  const double lr = 0.001;
  for (std::size_t s = 0; s < 6; ++s) {
    const float lc = train_step(*cpu.engine, data.get(s));
    const float lg = train_step(*gpu.engine, data.get(s));
    const double rel = std::fabs(double(lc) - double(lg)) / std::fabs(double(lc));
    std::printf("fp32 step %zu: loss cpu %.6f gpu %.6f (rel %.2e), norm cpu %.6f gpu %.6f\n", s + 1, lc, lg, rel,
                cpu.engine->get_global_grad_norm(), gpu.engine->get_global_grad_norm());
    CHECK_MSG(rel <= 1e-4, "fp32 step %zu: loss differs (cpu %.7f, gpu %.7f)", s + 1, lc, lg);
    const double nc = cpu.engine->get_global_grad_norm(), ng = gpu.engine->get_global_grad_norm();
    CHECK_MSG(std::fabs(nc - ng) <= 1e-3 * nc, "fp32 step %zu: grad norm differs (cpu %.7f, gpu %.7f)", s + 1, nc, ng);
  }
  const double pd = max_abs_diff(cpu.engine->gather_params_fp32(), gpu.engine->gather_params_fp32());
  std::printf("fp32: max |param cpu - gpu| after 6 steps = %.3e (lr %.0e)\n", pd, lr);
  CHECK_MSG(pd <= 3 * lr, "fp32: parameters diverged (max diff %.3e)", pd);
  CHECK_MSG(gpu.engine->global_steps() == 6 && gpu.engine->skipped_steps() == 0, "fp32: counters %lld/%lld",
            static_cast<long long>(gpu.engine->global_steps()), static_cast<long long>(gpu.engine->skipped_steps()));

  // GPU -> CPU.
  gpu.engine->save_checkpoint(dir.string(), std::string("from_gpu"));
  ds::nn::Gpt cpu2_model(small());
  auto cpu2 = make(cpu2_model, config(""));
  cpu2.engine->load_checkpoint(dir.string(), std::string("from_gpu"));
  const double d1 = max_abs_diff(gpu.engine->gather_params_fp32(), cpu2.engine->gather_params_fp32());
  const auto sg = states(*gpu.engine), sc = states(*cpu2.engine);
  double d2 = sg.size() == sc.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < sg.size() && i < sc.size(); ++i) d2 = std::max(d2, max_abs_diff(sg[i], sc[i]));
  std::printf("checkpoint gpu -> cpu: params diff %.3e, optimizer state diff %.3e\n", d1, d2);
  CHECK_MSG(d1 == 0 && d2 == 0, "gpu -> cpu checkpoint: not bit-exact (params %.3e, state %.3e)", d1, d2);
  CHECK_MSG(cpu2.engine->global_steps() == 6, "gpu -> cpu checkpoint: global_steps %lld",
            static_cast<long long>(cpu2.engine->global_steps()));

  // CPU -> GPU.
  cpu.engine->save_checkpoint(dir.string(), std::string("from_cpu"));
  ds::nn::GptCuda gpu2_model(small(), false);
  auto gpu2 = make(gpu2_model, config(""));
  gpu2.engine->load_checkpoint(dir.string(), std::string("from_cpu"));
  const double d3 = max_abs_diff(cpu.engine->gather_params_fp32(), gpu2.engine->gather_params_fp32());
  const auto sc2 = states(*cpu.engine), sg2 = states(*gpu2.engine);
  double d4 = sc2.size() == sg2.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < sc2.size() && i < sg2.size(); ++i) d4 = std::max(d4, max_abs_diff(sc2[i], sg2[i]));
  std::printf("checkpoint cpu -> gpu: params diff %.3e, optimizer state diff %.3e\n", d3, d4);
  CHECK_MSG(d3 == 0 && d4 == 0, "cpu -> gpu checkpoint: not bit-exact (params %.3e, state %.3e)", d3, d4);
  const float a = train_step(*cpu.engine, data.get(7));
  const float b = train_step(*gpu2.engine, data.get(7));
  std::printf("after the cpu -> gpu load, one more step: loss cpu %.6f gpu %.6f\n", a, b);
  CHECK_MSG(std::fabs(a - b) <= 1e-4 * std::fabs(a), "after load: losses differ (%.7f vs %.7f)", a, b);
}

void test_falls(const char* what, const std::string& extra, const std::string& optimizer, double ratio) {
  const Batches data(1, 21);
  ds::nn::GptCuda m(small());
  auto r = make(m, config(extra, optimizer, "none"));
  float first = 0, last = 0;
  for (int s = 0; s < 25; ++s) {
    last = train_step(*r.engine, data.get(0));
    if (s == 0) first = last;
  }
  std::printf("%s: loss %.4f -> %.4f over 25 steps (%lld skipped), loss scale %.0f\n", what, first, last,
              static_cast<long long>(r.engine->skipped_steps()), r.engine->loss_scale());
  CHECK_MSG(std::isfinite(last) && last < ratio * first, "%s: loss did not fall enough (%.4f -> %.4f)", what, first, last);
}

// SGD with momentum and Adagrad through the device optimizer: the same losses as the CPU engine.
void test_sgd_matches_cpu() {
  const Batches data(2, 41);
  for (const char* opt : {R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}})",
                          R"({"type": "Adagrad", "params": {"lr": 0.05}})"}) {
    ds::nn::Gpt cm(small());
    ds::nn::GptCuda gm(small(), false);
    auto c = make(cm, config("", opt, "none"));
    auto g = make(gm, config("", opt, "none"));
    double worst = 0;
    float lc = 0, lg = 0;
    for (std::size_t s = 0; s < 8; ++s) {
      lc = train_step(*c.engine, data.get(s));
      lg = train_step(*g.engine, data.get(s));
      worst = std::max(worst, std::fabs(double(lc) - double(lg)) / std::fabs(double(lc)));
    }
    std::printf("%s: 8 steps, last loss cpu %.6f gpu %.6f, worst relative loss difference %.2e\n",
                c.engine->optimizer()->name().data(), lc, lg, worst);
    CHECK_MSG(worst <= 1e-4, "%s: GPU losses differ from the CPU engine's (worst %.2e)",
              c.engine->optimizer()->name().data(), worst);
  }
}

void test_fp16_overflow() {
  const Batches data(1, 31);
  ds::nn::GptCuda m(small());
  auto r = make(m, config(R"(, "fp16": {"enabled": true, "initial_scale_power": 30, "loss_scale_window": 1000, "hysteresis": 1})",
                          kAdamFast, "none"));
  int skipped_seen = 0;
  float first = 0, last = 0;
  for (int s = 0; s < 40; ++s) {
    const double scale_before = r.engine->loss_scale();
    last = train_step(*r.engine, data.get(0));
    if (s == 0) first = last;
    if (!r.engine->was_step_applied()) {
      ++skipped_seen;
      CHECK_MSG(r.engine->loss_scale() == scale_before / 2, "fp16: skipped step %d did not halve the scale (%.0f -> %.0f)",
                s + 1, scale_before, r.engine->loss_scale());
    }
  }
  std::printf("fp16 from scale 2^30: %d skipped steps, scale now %.0f, loss %.4f -> %.4f\n", skipped_seen,
              r.engine->loss_scale(), first, last);
  CHECK_MSG(skipped_seen >= 5 && skipped_seen == r.engine->skipped_steps(), "fp16: expected >= 5 skipped steps, saw %d (engine says %lld)",
            skipped_seen, static_cast<long long>(r.engine->skipped_steps()));
  CHECK_MSG(last < 0.8 * first, "fp16: the loss did not fall after the scale settled (%.4f -> %.4f)", first, last);
}

void test_zero3_one_gpu_matches_cpu(const fs::path& dir) {
  const Batches data(3, 13);
  const std::string z3 = R"(, "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0})";
  ds::nn::Gpt cpu_model(small());
  ds::nn::GptCuda gpu_model(small(), /*allow_tf32=*/false);
  auto cpu = make(cpu_model, config(z3));
  auto gpu = make(gpu_model, config(z3));
  const double lr = 0.001;
  for (std::size_t s = 0; s < 6; ++s) {
    const float lc = train_step(*cpu.engine, data.get(s));
    const float lg = train_step(*gpu.engine, data.get(s));
    const double nc = cpu.engine->get_global_grad_norm(), ng = gpu.engine->get_global_grad_norm();
    std::printf("ZeRO-3 fp32 step %zu: loss cpu %.6f gpu %.6f, norm cpu %.6f gpu %.6f\n", s + 1, lc, lg, nc, ng);
    CHECK_MSG(std::fabs(double(lc) - double(lg)) <= 1e-4 * std::fabs(double(lc)), "ZeRO-3 step %zu: loss differs", s + 1);
    CHECK_MSG(std::fabs(nc - ng) <= 1e-3 * nc, "ZeRO-3 step %zu: grad norm differs", s + 1);
  }
  const std::vector<float> pg = gpu.engine->gather_params_fp32();
  const double pd = max_abs_diff(cpu.engine->gather_params_fp32(), pg);
  std::printf("ZeRO-3 fp32: max |param cpu - gpu| after 6 steps = %.3e (lr %.0e)\n", pd, lr);
  CHECK_MSG(pd <= 3 * lr, "ZeRO-3: parameters diverged (max diff %.3e)", pd);
  const auto rep = gpu.engine->memory_report();
  std::printf("ZeRO-3 on one GPU, memory report after a step: params %zu grads %zu master %zu\n", std::size_t(rep.params),
              std::size_t(rep.grads), std::size_t(rep.master));
  CHECK_MSG(rep.grads == rep.master && rep.params == rep.master,
            "ZeRO-3 on one GPU: flat chunks still mapped after a step (params %zu, grads %zu, pieces %zu)",
            std::size_t(rep.params), std::size_t(rep.grads), std::size_t(rep.master));
  gpu.engine->save_checkpoint(dir.string(), std::string("z3_from_gpu"));
  ds::nn::Gpt cpu2_model(small());
  auto cpu2 = make(cpu2_model, config(z3));
  cpu2.engine->load_checkpoint(dir.string(), std::string("z3_from_gpu"));
  const std::vector<float> pc = cpu2.engine->gather_params_fp32();
  CHECK_MSG(pc == pg, "ZeRO-3: the GPU checkpoint loaded on the CPU holds other parameters (max diff %.3e)",
            max_abs_diff(pc, pg));
}

void test_zero3_offload_param_refused() {
  for (const char* device : {"cpu", "nvme"}) {
    ds::nn::GptCuda m(small());
    bool threw = false;
    try {
      make(m, config(std::string(R"(, "zero_optimization": {"stage": 3, "offload_param": {"device": ")") + device +
                     R"(", "nvme_path": "/tmp"}})"));
    } catch (const ds::Error& e) {
      const std::string w = e.what();
      threw = w.find("zero_optimization.offload_param.device") != std::string::npos;
      std::printf("ZeRO-3 with offload_param %s on the GPU path: %s\n", device, e.what());
    }
    CHECK_MSG(threw, "ZeRO-3 with offload_param %s on the GPU path was not refused naming the key", device);
  }
}

}  // namespace

int main() {
  if (int rc = cuda_test::skip_without_gpu("test_cuda_engine")) return rc;
  const fs::path dir = fs::temp_directory_path() / ("ds_cuda_engine_" + std::to_string(::getpid()));
  try {
    test_fp32_matches_cpu_and_checkpoints(dir);
    test_falls("bf16 AdamW", R"(, "bf16": {"enabled": true})", kAdamFast, 0.6);
    test_sgd_matches_cpu();
    test_fp16_overflow();
    test_zero3_one_gpu_matches_cpu(dir);
    test_zero3_offload_param_refused();
  } catch (const std::exception& e) {
    std::printf("FAIL: exception: %s\n", e.what());
    ++g_failures;
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return cuda_test::finish("test_cuda_engine");
}
