// NVMe offload (zero_optimization.offload_optimizer / offload_param device "nvme") against
// the same run in memory, under real mpirun at 1, 2 and 4 ranks (tests/engine/CMakeLists.txt).
// The step is elementwise and runs the same kernels on the same values whatever the
// sub-group, so every comparison here is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/engine/engine.h"
#include "ds/mpi/init.h"
#include "../common/mpi_gtest_main.h"
#include "test_model.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<ds::Communicator> g_world;

// 48 inputs, 96 hidden: 48*96 + 96 + 96 + 1 = 4801 parameters plus 7 one-element tensors,
// several 4096-element sub-groups on one rank, and pieces that do not divide evenly.
constexpr int kD = 48, kH = 96, kExtra = 7;

fs::path swap_root() {
  static const fs::path p = [] {
    fs::path d = fs::temp_directory_path() / "dstrain_nvme_offload_test";
    fs::create_directories(d);
    return d;
  }();
  return p;
}

json config(const json& optimizer, const json& zero, const char* prec = nullptr) {
  json c{{"train_micro_batch_size_per_gpu", 2},
         {"gradient_accumulation_steps", 2},
         {"optimizer", optimizer},
         {"gradient_clipping", 0.5},
         {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 3}}}}},
         {"zero_optimization", zero}};
  if (prec) c[prec] = {{"enabled", true}};
  return c;
}

json nvme(const char* buffer_count = nullptr) {
  json o{{"device", "nvme"}, {"nvme_path", swap_root().string()}};
  if (buffer_count) o["buffer_count"] = std::stoi(buffer_count);
  return o;
}

// Stage `stage` with the fetcher exercised at stage 3 (nothing persistent, small prefetch).
json zero(int stage) {
  json z{{"stage", stage}, {"reduce_bucket_size", 3000}};
  if (stage == 3) {
    z["stage3_param_persistence_threshold"] = 0;
    z["stage3_prefetch_bucket_size"] = 2000;
  }
  return z;
}

struct Training {
  std::unique_ptr<ds::test::TestMlp> model;
  std::unique_ptr<ds::Engine> engine;
  std::vector<float> losses;
};

Training start(const json& cfg) {
  Training r;
  r.model = std::make_unique<ds::test::TestMlp>(kD, kH, kExtra);
  r.model->grouped = true;
  r.engine = ds::initialize(ds::config::parse_config_json(cfg), *r.model, g_world).engine;
  return r;
}

// Steps [from, to) on the shared data of kSteps steps (the targets depend on its length; rank r
// takes the r-th block of each micro-batch).
constexpr int kSteps = 6;
void steps(Training& r, int from, int to) {
  auto& e = *r.engine;
  const int W = g_world->size(), micro = int(e.train_micro_batch_size_per_gpu());
  const int gas = int(e.gradient_accumulation_steps()), tb = int(e.train_batch_size());
  ds::test::Data data(kSteps * tb, kD);
  for (int s = from; s < to; ++s)
    for (int k = 0; k < gas; ++k) {
      const float loss = e.forward(data.batch(s * tb + k * micro * W + g_world->rank() * micro, micro));
      e.backward(loss);
      e.step();
      r.losses.push_back(loss);
    }
}

struct Result {
  std::vector<float> params, losses;
};

Result train(const json& cfg, int n = 5) {
  Training r = start(cfg);
  steps(r, 0, n);
  return {r.engine->gather_params_fp32(), r.losses};
}

void expect_same(const Result& a, const Result& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what;
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  std::size_t diff = 0;
  for (std::size_t i = 0; i < a.params.size(); ++i) diff += a.params[i] != b.params[i];
  EXPECT_EQ(diff, 0u) << what << ": parameters differing from the run in memory";
}

std::size_t files_under(const fs::path& p) {
  std::size_t n = 0;
  for (const auto& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file() && e.path().filename() != "lock") n++;
  return n;
}

const std::vector<json> kOptimizers{
    {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}},
    {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}}}},
    {{"type", "Adagrad"}, {"params", {{"lr", 0.05}, {"initial_accumulator_value", 0.1}}}}};

}  // namespace

TEST(NvmeOffload, OptimizerOnNvmeEqualsMemoryEveryStage) {
  for (const auto& opt : kOptimizers) {
    for (int stage : {1, 2, 3}) {
      const Result ref = train(config(opt, zero(stage)));
      json z = zero(stage);
      z["offload_optimizer"] = nvme("2");
      z["sub_group_size"] = 4096;  // several sub-groups through a ring of two buffers
      expect_same(train(config(opt, z)), ref, "stage " + std::to_string(stage) + " " + opt.dump());
    }
  }
}

TEST(NvmeOffload, Stage3ParametersAndOptimizerOnNvmeInHalfPrecision) {
  const json& adamw = kOptimizers[0];
  for (const char* prec : {"bf16", "fp16"}) {
    const Result ref = train(config(adamw, zero(3), prec));
    json z = zero(3);
    z["offload_param"] = nvme();
    expect_same(train(config(adamw, z, prec)), ref, std::string(prec) + ": offload_param alone");
    z["offload_optimizer"] = nvme("4");
    z["sub_group_size"] = 1;  // rounded up to the 4096-element alignment
    expect_same(train(config(adamw, z, prec)), ref, std::string(prec) + ": both offloaded");
  }
}

TEST(NvmeOffload, MemoryReportAndSwapFilesGoWithTheEngine) {
  json z = zero(3);
  z["offload_optimizer"] = nvme();
  z["offload_param"] = nvme();
  z["sub_group_size"] = 4096;
  {
    Training r = start(config(kOptimizers[0], z));
    steps(r, 0, 1);
    const auto m = r.engine->memory_report();
    EXPECT_EQ(m.master, 0u);
    EXPECT_EQ(m.optimizer_state, 0u);
    // fp32 master + two Adam moments + the fp32 params, each padded to 4096 elements.
    const std::size_t P = r.engine->partition_map().partition_numel;
    const std::size_t pad = (P + 4095) / 4096 * 4096;
    EXPECT_EQ(m.on_nvme, pad * 4 * 4);
    EXPECT_GT(m.swap_buffers, 0u);
    EXPECT_LE(m.swap_buffers, 4 * 4 * std::size_t(4096) * 4);  // buffer_count sets of 4 tensors
    EXPECT_NE(m.to_string().find("on NVMe"), std::string::npos) << m.to_string();
    EXPECT_GE(files_under(swap_root()), 4u);
  }
  g_world->barrier();
  EXPECT_EQ(files_under(swap_root()), 0u) << "swap files left after every engine is gone";
}

TEST(NvmeOffload, CheckpointsLoadAcrossOffloadSettings) {
  const json& adamw = kOptimizers[0];
  const fs::path dir = swap_root().parent_path() / "dstrain_nvme_offload_ckpt";
  for (int stage : {2, 3}) {
    json off = zero(stage);
    off["offload_optimizer"] = nvme();
    off["sub_group_size"] = 4096;
    if (stage == 3) off["offload_param"] = nvme();
    const json plain = config(adamw, zero(stage));
    json offloaded = config(adamw, off);
    // At stage 3 the offloaded run saves asynchronously: the snapshot is copied from the mapped
    // swap files before the next step writes them.
    if (stage == 3) offloaded["checkpoint"] = {{"async_save", true}};
    const Result straight = train(plain, kSteps);
    // At stage 3 also the parameters alone on NVMe (the master in memory: the step and the
    // load write the parameter file behind, and the next gathers read it).
    std::vector<std::pair<json, json>> runs{{offloaded, plain}, {plain, offloaded}};
    if (stage == 3) {
      json params_only = zero(stage);
      params_only["offload_param"] = nvme();
      runs.push_back({config(adamw, params_only), plain});
      runs.push_back({plain, config(adamw, params_only)});
    }
    // Saved with NVMe offload, resumed in memory; and the other way round.
    for (const auto& [first, second] : runs) {
      if (g_world->rank() == 0) fs::remove_all(dir);
      g_world->barrier();
      Training a = start(first);
      steps(a, 0, 3);
      a.engine->save_checkpoint(dir.string(), "mid");
      steps(a, 3, 4);  // a step while an async save is in flight must not change what it writes
      a.engine->wait_for_checkpoint();
      a.losses.pop_back();
      a.losses.pop_back();  // gas 2: the extra step's two micro-batch losses
      a.engine.reset();
      Training b = start(second);
      ASSERT_TRUE(b.engine->load_checkpoint(dir.string(), "mid").has_value());
      steps(b, 3, kSteps);
      std::vector<float> losses = a.losses;
      losses.insert(losses.end(), b.losses.begin(), b.losses.end());
      expect_same(Result{b.engine->gather_params_fp32(), losses}, straight,
                  "stage " + std::to_string(stage) + ": " + first["zero_optimization"].dump() + " -> " +
                      second["zero_optimization"].dump());
    }
  }
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

TEST(NvmeOffload, WeightsOnlyLoadAtStage3ReadsEachRanksPieces) {
  // load_optimizer_states = false (DeepSpeed's _restore_from_bit16_weights): every rank reads
  // only its pieces of each tensor (read_param_range) into the master, in memory or on NVMe.
  const json& adamw = kOptimizers[0];
  const fs::path dir = swap_root().parent_path() / "dstrain_nvme_weights_only";
  if (g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  Training a = start(config(adamw, zero(3), "bf16"));
  steps(a, 0, 2);
  a.engine->save_checkpoint(dir.string(), "w");
  const std::vector<float> saved = a.engine->gather_params_fp32();
  a.engine.reset();
  json off = zero(3);
  off["offload_optimizer"] = nvme();
  off["offload_param"] = nvme();
  for (const json& z : {zero(3), off}) {
    Training b = start(config(adamw, z, "bf16"));
    ds::LoadOptions lo;
    lo.load_optimizer_states = false;
    ASSERT_TRUE(b.engine->load_checkpoint(dir.string(), "w", lo).has_value());
    EXPECT_EQ(b.engine->gather_params_fp32(), saved) << z.dump();
    steps(b, 2, 3);  // and it trains on from them
    for (float l : b.losses) EXPECT_TRUE(std::isfinite(l));
  }
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}

TEST(NvmeOffload, MissingPathIsAClearErrorAtInitialize) {
  json z = zero(2);
  z["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", "/nonexistent/dstrain-swap-test"}};
  try {
    start(config(kOptimizers[0], z));
    FAIL() << "initialize accepted a missing nvme_path";
  } catch (const ds::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("offload_optimizer.nvme_path"), std::string::npos) << m;
    EXPECT_NE(m.find("/nonexistent/dstrain-swap-test"), std::string::npos) << m;
  }
}

int main(int argc, char** argv) { return ds::test::mpi_gtest_main(argc, argv, g_world); }
