// Engine tests, run under real mpirun at 1, 2 and 4 ranks (tests/engine/CMakeLists.txt).
// Every rank runs every test; reference runs use a world-size-1 communicator (SelfComm) on
// the whole batch. Tolerances are stated beside each comparison.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ds/config/parse.h"
#include "ds/config/registry.h"
#include "ds/core/error.h"
#include "ds/engine/args.h"
#include "ds/engine/engine.h"
#include "ds/engine/memory.h"
#include "ds/engine/monitor.h"
#include "ds/mpi/init.h"
#include "ds/mpi/mpi_comm.h"
#include "ds/optim/optimizer.h"
#include "ds/sched/lr_scheduler.h"
#include "../common/mpi_gtest_main.h"
#include "test_model.h"

using nlohmann::json;

namespace {

std::shared_ptr<ds::Communicator> g_world;

constexpr int kD = 3, kH = 5;  // 15 + 5 + 5 + 1 = 26 parameters: not divisible by 4 or 8

// Adam is invariant to the gradient's scale, so every equivalence test also runs SGD with
// momentum (sgd = true), which is not: a wrong averaging factor fails it.
json base_config(int micro, int gas, bool sgd = false) {
  json opt = sgd ? json{{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}}}}
                 : json{{"type", "Adam"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}};
  return json{{"train_micro_batch_size_per_gpu", micro},
              {"gradient_accumulation_steps", gas},
              {"optimizer", opt},
              {"gradient_clipping", 1.0}};
}

ds::config::DsConfig parse(const json& j) { return ds::config::parse_config_json(j); }

struct RunOptions {
  int steps = 6;
  int extra_params = 0;
  ds::test::TestMlp::ReadyOrder order = ds::test::TestMlp::ReadyOrder::Reverse;
  bool grouped = false;  // the module declares ZeRO-3 parameter groups
};

// ZeRO-3 settings that make the fetcher work on the tiny test model: nothing persistent (so
// groups are gathered and released), prefetch smaller than the model, and either no reuse
// (every release frees) or DeepSpeed's default reuse distance (groups kept from forward to
// backward).
json zero3(bool reuse = false, int bucket = 9) {
  return json{{"stage", 3},
              {"reduce_bucket_size", bucket},
              {"stage3_param_persistence_threshold", 0},
              {"stage3_prefetch_bucket_size", 12},
              {"stage3_max_reuse_distance", reuse ? 1000000000 : 0}};
}

// Trains on the shared data: step s uses samples [s*TB, (s+1)*TB); micro-step k of it uses
// [s*TB + k*micro*W, +micro*W) and rank r the r-th block of `micro` samples of that.
std::vector<float> train(const json& cfg, std::shared_ptr<ds::Communicator> comm, const RunOptions& o = {},
                         std::unique_ptr<ds::Engine>* keep = nullptr) {
  ds::test::TestMlp model(kD, kH, o.extra_params);
  model.order = o.order;
  model.grouped = o.grouped;
  auto r = ds::initialize(parse(cfg), model, comm);
  auto& e = *r.engine;
  const int W = comm->size(), micro = int(e.train_micro_batch_size_per_gpu()), gas = int(e.gradient_accumulation_steps());
  const int tb = int(e.train_batch_size());
  ds::test::Data data(o.steps * tb, kD);
  for (int s = 0; s < o.steps; ++s) {
    for (int k = 0; k < gas; ++k) {
      const int first = s * tb + k * micro * W + comm->rank() * micro;
      float loss = e.forward(data.batch(first, micro));
      e.backward(loss);
      e.step();
    }
  }
  auto p = e.gather_params_fp32();
  if (keep) *keep = std::move(r.engine);
  return p;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

std::shared_ptr<ds::Communicator> self() { return std::make_shared<ds::test::SelfComm>(); }

int W() { return g_world->size(); }

}  // namespace

// ---------------------------------------------------------------------------------------
// Pure layout: partition map and memory estimate
// ---------------------------------------------------------------------------------------

TEST(Partition, PadsToTwoWAndSplitsContiguously) {
  std::vector<ds::ParamInfo> ps{{"a", {3, 5}}, {"b", {5}}, {"c", {1}}};  // 21 elements
  auto m = ds::engine::make_partition_map(ps, 4, 1);
  EXPECT_EQ(m.total_numel, 21u);
  EXPECT_EQ(m.padded_numel, 24u);  // multiple of 2*4
  EXPECT_EQ(m.partition_numel, 6u);
  ASSERT_EQ(m.slices.size(), 4u);
  EXPECT_EQ(m.slices[3].offset, 18u);
  EXPECT_EQ(m.slices[3].real_count, 3u);
  // Rank 2 owns [12, 18): a[12..15) and b[0..3).
  auto seg = m.segments(2);
  ASSERT_EQ(seg.size(), 2u);
  EXPECT_EQ(seg[0].param_index, 0u);
  EXPECT_EQ(seg[0].param_offset, 12u);
  EXPECT_EQ(seg[0].count, 3u);
  EXPECT_EQ(seg[1].param_index, 1u);
  EXPECT_EQ(seg[1].slice_offset, 3u);
  EXPECT_EQ(seg[1].count, 3u);
  // World larger than the model: most slices are padding only.
  auto big = ds::engine::make_partition_map({{"x", {1}}}, 8, 2);
  EXPECT_EQ(big.padded_numel, 16u);
  EXPECT_EQ(big.slices[0].real_count, 1u);
  EXPECT_EQ(big.slices[5].real_count, 0u);
  EXPECT_TRUE(big.segments(5).empty());
  EXPECT_THROW(ds::engine::make_partition_map(ps, 2, 4), ds::Error);
}

TEST(Partition, Stage3PiecesOfEveryGroup) {
  // Groups {a, b} (20 elements) and {c} (1): padded to multiples of W = 4 (20, 4), pieces 5
  // and 1, each group on its own 2 MiB of the flat space; rank r keeps piece r of each.
  std::vector<ds::ParamInfo> ps{{"a", {3, 5}}, {"b", {5}}, {"c", {1}}};
  std::vector<ds::ParamGroup> gs{{"ab", 0, 2}, {"c", 2, 1}};
  auto m = ds::engine::make_partition_map(ps, 4, 3, gs, 4);
  const std::size_t page = ds::engine::PagedBuffer::kHugePage / 4;
  ASSERT_EQ(m.groups.size(), 2u);
  EXPECT_EQ(m.total_numel, 21u);
  EXPECT_EQ(m.groups[0].offset, 0u);
  EXPECT_EQ(m.groups[0].piece, 5u);
  EXPECT_EQ(m.groups[1].offset, page);
  EXPECT_EQ(m.groups[1].padded, 4u);
  EXPECT_EQ(m.groups[1].dense_offset, 20u);
  EXPECT_EQ(m.params[2].offset, page);
  EXPECT_EQ(m.params[2].dense_offset, 20u);
  EXPECT_EQ(m.partition_numel, 6u);
  EXPECT_EQ(m.groups[1].piece_real(0), 1u);
  EXPECT_EQ(m.groups[1].piece_real(1), 0u);
  EXPECT_EQ(m.group_of(1), 0u);
  EXPECT_EQ(m.group_of(2), 1u);
  // Rank 2: a[10..15) at partition 0, nothing of c (padding) -> one segment.
  auto seg = m.segments(2);
  ASSERT_EQ(seg.size(), 1u);
  EXPECT_EQ(seg[0].param_offset, 10u);
  EXPECT_EQ(seg[0].count, 5u);
  // Rank 0: a[0..5), and c at partition offset 5.
  seg = m.segments(0);
  ASSERT_EQ(seg.size(), 2u);
  EXPECT_EQ(seg[1].param_index, 2u);
  EXPECT_EQ(seg[1].slice_offset, 5u);
  // No groups declared: one group of everything.
  EXPECT_EQ(ds::engine::make_partition_map(ps, 2, 3).groups.size(), 1u);
  // Groups must tile the parameters in order.
  EXPECT_THROW(ds::engine::make_partition_map(ps, 2, 3, {{"x", 0, 1}, {"y", 2, 1}}), ds::Error);
  EXPECT_THROW(ds::engine::make_partition_map(ps, 2, 3, {{"x", 0, 2}}), ds::Error);
}

TEST(Memory, EstimateMatchesZeroPaper) {
  const std::size_t P = 1000000;
  auto s1 = ds::engine::estimate_model_states_bytes(P, 4, 1, ds::DType::F16, 8);
  EXPECT_EQ(s1.total(), 2 * P + 2 * P + 12 * P / 4);
  auto s2 = ds::engine::estimate_model_states_bytes(P, 4, 2, ds::DType::F16, 8);
  EXPECT_EQ(s2.total(), 2 * P + 14 * P / 4);
  auto s0 = ds::engine::estimate_model_states_bytes(P, 4, 0, ds::DType::F16, 8);
  EXPECT_EQ(s0.total(), 16 * P);
  auto s3 = ds::engine::estimate_model_states_bytes(P, 4, 3, ds::DType::F16, 8);
  EXPECT_EQ(s3.total(), 18 * P / 4);  // DeepSpeed's 18 bytes per parameter
  EXPECT_EQ(ds::engine::deepspeed_zero3_estimate_bytes(P, 1000, 4), 4000 + 18 * P / 4);
  EXPECT_EQ(ds::engine::optimizer_state_bytes_per_param("adamw"), 8u);
  EXPECT_THROW(ds::engine::optimizer_state_bytes_per_param("rmsprop"), ds::Error);
}

// The optimizer descriptors are the one list of state tensors: each optimizer keeps what its
// descriptor names, and the memory estimate counts it (SGD with and without momentum).
TEST(Memory, OptimizerStateComesFromTheDescriptor) {
  for (const auto& d : ds::config::optimizer_registry()) {
    for (double momentum : {0.0, 0.9}) {
      ds::optim::OptimizerParams p = d.defaults;
      p.momentum = momentum;
      ASSERT_NE(d.state, nullptr) << d.name;
      EXPECT_EQ(ds::optim::make_optimizer(p)->state_names(), d.state(p)) << d.name << " momentum " << momentum;
      EXPECT_EQ(ds::engine::optimizer_state_bytes_per_param(d.name, momentum != 0), 4 * d.state(p).size()) << d.name;
    }
  }
  EXPECT_EQ(ds::engine::optimizer_state_bytes_per_param("sgd", false), 0u);
  EXPECT_EQ(ds::engine::optimizer_state_bytes_per_param("lamb"), 8u);
}

TEST(Args, DeepSpeedFlags) {
  const char* argv[] = {"train", "--deepspeed", "--deepspeed_config", "ds.json", "--local_rank=0", "--steps", "3"};
  std::vector<std::string> rest;
  auto a = ds::engine::parse_deepspeed_args(7, argv, &rest);
  EXPECT_TRUE(a.deepspeed);
  EXPECT_EQ(a.deepspeed_config, "ds.json");
  EXPECT_EQ(a.local_rank, 0);
  EXPECT_EQ(rest, (std::vector<std::string>{"train", "--steps", "3"}));
  const char* bad[] = {"train", "--local_rank", "x"};
  EXPECT_THROW(ds::engine::parse_deepspeed_args(3, bad), ds::Error);
}

// ---------------------------------------------------------------------------------------
// Step semantics
// ---------------------------------------------------------------------------------------

TEST(Engine, CountersAndBoundaries) {
  auto cfg = base_config(2, 3);
  ds::test::TestMlp model(kD, kH);
  auto r = ds::initialize(parse(cfg), model, g_world);
  auto& e = *r.engine;
  ASSERT_NE(r.optimizer, nullptr);
  ASSERT_NE(r.lr_scheduler, nullptr);
  EXPECT_EQ(e.train_batch_size(), 2 * 3 * W());
  ds::test::Data data(64, kD);
  std::vector<bool> boundaries;
  for (int i = 0; i < 7; ++i) {
    boundaries.push_back(e.is_gradient_accumulation_boundary());
    float l = e.forward(data.batch(2 * i, 2));
    EXPECT_FLOAT_EQ(e.backward(l), l / 3.0f);
    e.step();
  }
  EXPECT_EQ(boundaries, (std::vector<bool>{false, false, true, false, false, true, false}));
  EXPECT_EQ(e.micro_steps(), 7);
  EXPECT_EQ(e.global_steps(), 2);
  EXPECT_EQ(e.global_samples(), 2 * e.train_batch_size());
  EXPECT_EQ(e.skipped_steps(), 0);
  EXPECT_GT(e.get_global_grad_norm(), 0.0);
}

TEST(Engine, AccumulationEquivalenceWorldSize1) {
  // gas 4 x micro 2 == gas 1 x micro 8 on the same 8 samples per step. Tolerance: 1e-6
  // absolute on parameters of magnitude <= 1 (fp32 summation order differs).
  RunOptions o;
  o.steps = 5;
  for (bool sgd : {false, true}) {
    auto a = train(base_config(2, 4, sgd), self(), o);
    auto b = train(base_config(8, 1, sgd), self(), o);
    EXPECT_LT(max_abs_diff(a, b), 1e-6) << "sgd " << sgd;
  }
}

TEST(Engine, DataParallelEquivalence) {
  // W ranks with micro 8/W == 1 rank with micro 8, for every ZeRO stage, with small buckets
  // (parameters straddle buckets) and the default one bucket. Tolerance 2e-6 (fp32; the
  // all-reduce and the per-rank means sum in a different order).
  if (8 % W() != 0) GTEST_SKIP() << "needs a world size dividing 8";
  RunOptions o;
  o.steps = 6;
  for (bool sgd : {false, true}) {
    auto ref = train(base_config(8, 1, sgd), self(), o);
    for (int stage : {0, 1, 2}) {
      for (int bucket : {7, 500000000}) {
        auto cfg = base_config(8 / W(), 1, sgd);
        cfg["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", bucket}, {"allgather_bucket_size", 6}};
        auto p = train(cfg, g_world, o);
        EXPECT_LT(max_abs_diff(p, ref), 2e-6) << "sgd " << sgd << " stage " << stage << " bucket " << bucket;
      }
    }
    // Stage 3: the whole model as one group, and two declared groups with and without reuse.
    for (auto [grouped, reuse] : {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
      auto cfg = base_config(8 / W(), 1, sgd);
      cfg["zero_optimization"] = zero3(reuse);
      RunOptions g = o;
      g.grouped = grouped;
      EXPECT_LT(max_abs_diff(train(cfg, g_world, g), ref), 2e-6) << "sgd " << sgd << " stage 3 grouped " << grouped
                                                                  << " reuse " << reuse;
    }
  }
}

TEST(Engine, DataParallelEquivalenceWithAccumulation) {
  // W ranks x micro 8/(2W) x gas 2 == 1 rank x micro 8; tolerance 2e-6 as above.
  if (8 % (2 * W()) != 0) GTEST_SKIP() << "needs 2W dividing 8";
  RunOptions o;
  o.steps = 4;
  for (bool sgd : {false, true}) {
    auto ref = train(base_config(8, 1, sgd), self(), o);
    for (int stage : {0, 1, 2}) {
      auto cfg = base_config(8 / (2 * W()), 2, sgd);
      cfg["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 9}};
      auto p = train(cfg, g_world, o);
      EXPECT_LT(max_abs_diff(p, ref), 2e-6) << "sgd " << sgd << " stage " << stage;
    }
    for (bool grouped : {false, true}) {
      auto cfg = base_config(8 / (2 * W()), 2, sgd);
      cfg["zero_optimization"] = zero3(grouped);
      RunOptions g = o;
      g.grouped = grouped;
      EXPECT_LT(max_abs_diff(train(cfg, g_world, g), ref), 2e-6) << "sgd " << sgd << " stage 3 grouped " << grouped;
    }
  }
}

TEST(Engine, GradReadyOrderDoesNotMatter) {
  // Modules that report in forward order, never, or twice give the same result (buckets
  // launch strictly in index order). Bitwise: the same sums in the same order.
  RunOptions o;
  o.steps = 3;
  auto cfg = base_config(2, 2);
  cfg["zero_optimization"] = {{"stage", 2}, {"reduce_bucket_size", 6}};
  auto ref = train(cfg, g_world, o);
  using RO = ds::test::TestMlp::ReadyOrder;
  for (RO ro : {RO::Forward, RO::Never, RO::Twice}) {
    o.order = ro;
    EXPECT_EQ(max_abs_diff(train(cfg, g_world, o), ref), 0.0) << int(ro);
  }
}

TEST(Engine, BucketsStartDuringBackward) {
  // Overlap: with buckets smaller than the model, all but the last bucket start their
  // all-reduce while the module's backward is still running -- only on the last
  // micro-batch of a cycle for stages 0/1, on every micro-batch for stage 2.
  if (W() == 1) GTEST_SKIP() << "no communication at world size 1";
  for (int stage : {0, 1, 2}) {
    ds::test::TestMlp model(kD, kH);
    auto rec = std::make_shared<ds::test::RecordingComm>(g_world, [&model] { return model.in_backward; });
    auto cfg = base_config(2, 2);
    cfg["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 6}};
    auto r = ds::initialize(parse(cfg), model, rec);
    ds::test::Data data(64, kD);
    for (int i = 0; i < 4; ++i) {  // two optimizer steps
      float l = r.engine->forward(data.batch(2 * i, 2));
      r.engine->backward(l);
      r.engine->step();
    }
    // 26 parameters padded (ZeRO) to 28 or 32 -> 5 or 6 buckets of 6; fc1.weight (15
    // elements, the first parameter, reported last) spans the last buckets.
    const int backwards_reducing = stage == 2 ? 4 : 2;
    const int buckets = int((r.engine->partition_map().padded_numel + 5) / 6);
    EXPECT_EQ(rec->started_total, backwards_reducing * buckets) << "stage " << stage;
    EXPECT_GE(rec->started_during, backwards_reducing * 2) << "stage " << stage;
  }
}

TEST(Engine, ZeroStagesMatchStage0MixedPrecision) {
  // fp16 / bf16 working params: ZeRO-1 and ZeRO-2 vs stage 0 at the same world size.
  // Tolerance: 4 ulps of the working dtype at magnitude 1 (fp16 2^-10, bf16 2^-7): the
  // partitioned gradient norm sums in another order, ZeRO-2 accumulates reduced sums.
  RunOptions o;
  o.steps = 5;
  o.extra_params = 3;  // tensors of one element: smaller than the world
  for (const char* prec : {"fp16", "bf16"}) {
    auto cfg = base_config(2, 2, true);
    cfg[prec] = {{"enabled", true}};
    if (std::string(prec) == "fp16") cfg[prec]["initial_scale_power"] = 8;
    auto ref = train(cfg, g_world, o);
    const double tol = std::string(prec) == "fp16" ? 4.0 / 1024 : 4.0 / 128;
    for (int stage : {1, 2}) {
      cfg["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 11}};
      EXPECT_LT(max_abs_diff(train(cfg, g_world, o), ref), tol) << prec << " stage " << stage;
    }
    cfg["zero_optimization"] = zero3();
    RunOptions g = o;
    g.grouped = true;
    EXPECT_LT(max_abs_diff(train(cfg, g_world, g), ref), tol) << prec << " stage 3";
  }
}

TEST(Engine, Fp32ZeroMatchesStage0EveryOptimizer) {
  // Tolerance 1e-6: only the order of the gradient-norm sum differs (clipping active).
  RunOptions o;
  o.steps = 6;
  o.extra_params = 5;
  const std::vector<json> optimizers{
      {{"type", "Adam"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}}}},
      {{"type", "Adam"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.01}, {"adam_w_mode", false}}}},
      {{"type", "AdamW"}, {"params", {{"lr", 0.01}, {"weight_decay", 0.1}}}},
      {{"type", "SGD"}, {"params", {{"lr", 0.05}, {"momentum", 0.9}, {"nesterov", true}}}},
      {{"type", "Adagrad"}, {"params", {{"lr", 0.05}}}}};
  for (const auto& opt : optimizers) {
    auto cfg = base_config(2, 2, true);
    cfg["optimizer"] = opt;
    cfg["gradient_clipping"] = 0.05;
    cfg["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 4}}}};
    auto ref = train(cfg, g_world, o);
    for (int stage : {1, 2}) {
      cfg["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 10}};
      EXPECT_LT(max_abs_diff(train(cfg, g_world, o), ref), 1e-6) << "stage " << stage << " " << opt.dump();
    }
    cfg["zero_optimization"] = zero3();
    RunOptions g = o;
    g.grouped = true;
    EXPECT_LT(max_abs_diff(train(cfg, g_world, g), ref), 1e-6) << "stage 3 " << opt.dump();
  }
}

TEST(Engine, LambDataParallelEquivalence) {
  // Lamb's trust ratio is per tensor (the engine passes one Segment per parameter).
  if (8 % W() != 0) GTEST_SKIP() << "needs a world size dividing 8";
  RunOptions o;
  o.steps = 4;
  auto cfg = base_config(8, 1);
  cfg["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 0.01}}}};
  auto ref = train(cfg, self(), o);
  cfg["train_micro_batch_size_per_gpu"] = 8 / W();
  cfg["zero_optimization"] = {{"reduce_bucket_size", 7}};
  EXPECT_LT(max_abs_diff(train(cfg, g_world, o), ref), 2e-6);
}

TEST(Engine, Fp16StuckAtMinimumScaleIsAClearError) {
  auto cfg = base_config(2, 1);
  cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 1}, {"hysteresis", 1}, {"min_loss_scale", 1}};
  ds::test::TestMlp model(kD, kH);
  model.inf_grad_on_backward = {0, 1, 2, 3, 4, 5};
  auto r = ds::initialize(parse(cfg), model, g_world);
  ds::test::Data data(64, kD);
  std::string msg;
  try {
    for (int s = 0; s < 6; ++s) {
      float l = r.engine->forward(data.batch(2 * s, 2));
      r.engine->backward(l);
      r.engine->step();
    }
  } catch (const ds::Error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("min_loss_scale"), std::string::npos) << msg;
}

TEST(Engine, CommunicationDataTypeFp32WithFp16Model) {
  if (W() == 1) GTEST_SKIP() << "communication needs more than one rank";
  RunOptions o;
  o.steps = 4;
  auto cfg = base_config(2, 1, true);
  cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
  auto ref = train(cfg, g_world, o);
  cfg["communication_data_type"] = "fp32";
  std::unique_ptr<ds::Engine> e;
  auto p = train(cfg, g_world, o, &e);
  EXPECT_EQ(e->communication_dtype(), ds::DType::F32);
  EXPECT_LT(max_abs_diff(p, ref), 4.0 / 1024);
  cfg["prescale_gradients"] = true;
  EXPECT_LT(max_abs_diff(train(cfg, g_world, o), ref), 4.0 / 1024);
  cfg["prescale_gradients"] = false;
  cfg["gradient_predivide_factor"] = 2.0;
  EXPECT_LT(max_abs_diff(train(cfg, g_world, o), ref), 4.0 / 1024);
}

TEST(Engine, InitializeWithoutCommunicatorUsesWorld) {
  // comm == nullptr: the engine calls ds::init_distributed() itself (MPI already up here,
  // so it is neither re-initialized nor finalized) and trains over COMM_WORLD.
  ds::test::TestMlp model(kD, kH);
  auto r = ds::initialize(base_config(2, 1).dump(), model);  // JSON text
  EXPECT_EQ(r.engine->comm().size(), W());
  EXPECT_EQ(r.engine->train_batch_size(), 2 * W());
  ds::test::Data data(64, kD);
  float l = r.engine->forward(data.batch(2 * g_world->rank(), 2));
  r.engine->backward(l);
  r.engine->step();
  EXPECT_EQ(r.engine->global_steps(), 1);
}

TEST(Engine, CommunicationSectionTurnsHostPathsOff) {
  // The config's `communication` section reaches the communicator initialize makes: with
  // both switches off, no shared-memory window path and no progress thread are used.
  ds::test::TestMlp model(kD, kH);
  json cfg = base_config(2, 1);
  cfg["communication"] = {{"shared_memory", false}, {"progress_thread", false}};
  auto r = ds::initialize(cfg.dump(), model);
  auto* mpi = dynamic_cast<ds::MpiComm*>(&r.engine->comm());
  ASSERT_NE(mpi, nullptr);
  EXPECT_FALSE(mpi->shm_enabled());
  EXPECT_FALSE(mpi->uses_progress_thread());
  ds::test::Data data(64, kD);
  float l = r.engine->forward(data.batch(2 * g_world->rank(), 2));
  r.engine->backward(l);
  r.engine->step();
  EXPECT_EQ(r.engine->global_steps(), 1);
}

// comms_logger off (the default): the engine keeps the communicator it was given, so nothing is
// timed; on: a recording one over it, whose summary holds the step's collectives.
TEST(Engine, CommsLoggerWrapsTheCommunicatorOnlyWhenEnabled) {
  ds::test::TestMlp model(kD, kH);
  auto off = ds::initialize(parse(base_config(2, 1)), model, g_world);
  EXPECT_EQ(off.engine->comm_ptr(), g_world);
  EXPECT_EQ(off.engine->comms_summary(), "");
  json cfg = base_config(2, 1);
  cfg["comms_logger"] = {{"enabled", true}};
  ds::test::TestMlp logged(kD, kH);
  auto on = ds::initialize(parse(cfg), logged, g_world);
  EXPECT_NE(on.engine->comm_ptr(), g_world);
  EXPECT_EQ(on.engine->comm().size(), W());
  ds::test::Data data(64, kD);
  float l = on.engine->forward(data.batch(2 * g_world->rank(), 2));
  on.engine->backward(l);
  on.engine->step();
  const std::string summary = on.engine->comms_summary();
  if (W() > 1) {  // one rank moves nothing
    EXPECT_NE(summary.find("\nbroadcast\n"), std::string::npos) << summary;   // the initial parameters
    EXPECT_NE(summary.find("\nall_reduce\n"), std::string::npos) << summary;  // the gradients
  }
}

TEST(Engine, BroadcastAtInitMakesReplicasEqual) {
  auto cfg = base_config(2, 1);
  cfg["seed"] = 42 + g_world->rank();  // different seeds per rank
  ds::test::TestMlp model(kD, kH);
  auto r = ds::initialize(parse(cfg), model, g_world);
  auto p = r.engine->gather_params_fp32();
  std::vector<float> all(p.size() * std::size_t(W()));
  g_world->all_gather(ds::TensorView{p.data(), p.size(), ds::DType::F32},
                      ds::TensorView{all.data(), all.size(), ds::DType::F32});
  for (int k = 1; k < W(); ++k)
    for (std::size_t i = 0; i < p.size(); ++i) EXPECT_EQ(all[i], all[std::size_t(k) * p.size() + i]);
  // ...and equal to rank 0's own initialisation with seed 42.
  ds::test::TestMlp ref_model(kD, kH);
  auto cfg0 = base_config(2, 1);
  cfg0["seed"] = 42;
  auto r0 = ds::initialize(parse(cfg0), ref_model, self());
  EXPECT_EQ(max_abs_diff(r0.engine->gather_params_fp32(), p), 0.0);
}

TEST(Engine, DifferentModelsOnRanksFailOnEveryRank) {
  if (W() < 2) GTEST_SKIP() << "needs more than one rank";
  auto cfg = base_config(2, 1);
  ds::test::TestMlp model(kD, kH + (g_world->rank() == 1 ? 1 : 0));  // rank 1 is wider
  try {
    auto r = ds::initialize(parse(cfg), model, g_world);
    FAIL() << "initialize accepted different models on different ranks";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the ranks hold different models"), std::string::npos) << e.what();
  }
  // Same model everywhere still initializes (the communicator is still usable after the error).
  ds::test::TestMlp same(kD, kH);
  EXPECT_NO_THROW(ds::initialize(parse(cfg), same, g_world));
}

TEST(Engine, ClippingUsesGlobalPreClipNorm) {
  // SGD lr 1 (no momentum): the update is -coef * g. Unclipped run gives g and its norm;
  // the clipped run must report the same pre-clip norm and apply coef = c / (norm + 1e-6).
  RunOptions o;
  o.steps = 1;
  auto cfg = base_config(2, 1);
  cfg["optimizer"] = {{"type", "SGD"}, {"params", {{"lr", 1.0}}}};
  cfg["gradient_clipping"] = 0.0;
  std::unique_ptr<ds::Engine> e0, e1;
  ds::test::TestMlp init_model(kD, kH);
  auto init = ds::initialize(parse(cfg), init_model, g_world).engine->gather_params_fp32();
  auto p0 = train(cfg, g_world, o, &e0);
  const double norm = e0->get_global_grad_norm();
  double ss = 0;
  for (std::size_t i = 0; i < p0.size(); ++i) ss += double(p0[i] - init[i]) * double(p0[i] - init[i]);
  EXPECT_NEAR(norm, std::sqrt(ss), 1e-5 * norm);
  const double clip = norm / 4;
  cfg["gradient_clipping"] = clip;
  cfg["zero_optimization"] = {{"stage", 2}};
  auto p1 = train(cfg, g_world, o, &e1);
  EXPECT_NEAR(e1->get_global_grad_norm(), norm, 1e-5 * norm);  // pre-clip
  const double coef = clip / (norm + 1e-6);
  for (std::size_t i = 0; i < p0.size(); ++i)
    EXPECT_NEAR(double(p1[i] - init[i]), coef * double(p0[i] - init[i]), 1e-6);
}

TEST(Engine, Fp16OverflowSkipsStepAndScheduler) {
  // Inject inf gradients on rank 0 only, on backward calls 1 and 4 (gas 1): every rank must
  // agree to skip (MAX of the flag), the scale halves (hysteresis 1), the scheduler does
  // not step, and the counters say so.
  for (int stage : {0, 2, 3}) {
    auto cfg = base_config(2, 1);
    cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 10}, {"hysteresis", 1}, {"loss_scale_window", 100}};
    cfg["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}};
    cfg["zero_optimization"] = stage == 3 ? zero3() : json{{"stage", stage}};
    ds::test::TestMlp model(kD, kH);
    model.grouped = stage == 3;  // the inf lands in one group's piece, on one rank
    if (g_world->rank() == 0) model.inf_grad_on_backward = {1, 4};
    auto r = ds::initialize(parse(cfg), model, g_world);
    auto& e = *r.engine;
    const auto it0 = r.lr_scheduler->last_batch_iteration();
    ds::test::Data data(64, kD);
    std::vector<double> scales;
    std::vector<bool> applied;
    for (int s = 0; s < 6; ++s) {
      scales.push_back(e.loss_scale());
      float l = e.forward(data.batch(2 * s, 2));
      e.backward(l);
      e.step();
      applied.push_back(e.was_step_applied());
    }
    EXPECT_EQ(applied, (std::vector<bool>{true, false, true, true, false, true})) << "stage " << stage;
    EXPECT_EQ(e.skipped_steps(), 2);
    EXPECT_EQ(e.global_steps(), 6);
    EXPECT_EQ(r.lr_scheduler->last_batch_iteration() - it0, 4);
    EXPECT_EQ(scales, (std::vector<double>{1024, 1024, 512, 512, 512, 256}));
    EXPECT_DOUBLE_EQ(e.loss_scale(), 256);
  }
}

TEST(Engine, NanLossSkipsStepInFp32AndBf16) {
  for (const char* prec : {"fp32", "bf16"}) {
    auto cfg = base_config(2, 1);
    if (std::string(prec) == "bf16") cfg["bf16"] = {{"enabled", true}};
    ds::test::TestMlp model(kD, kH);
    if (g_world->rank() == W() - 1) model.nan_loss_on_forward = {2};
    auto r = ds::initialize(parse(cfg), model, g_world);
    auto& e = *r.engine;
    ds::test::Data data(64, kD);
    std::vector<float> before;
    for (int s = 0; s < 4; ++s) {
      if (s == 2) before = e.gather_params_fp32();
      float l = e.forward(data.batch(2 * s, 2));
      e.backward(l);
      e.step();
      if (s == 2) {
        EXPECT_EQ(max_abs_diff(before, e.gather_params_fp32()), 0.0) << prec;
      }
    }
    EXPECT_EQ(e.skipped_steps(), 1) << prec;
    EXPECT_EQ(e.global_steps(), 4) << prec;
  }
}

TEST(Engine, CsvMonitorRows) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dstrain_engine_csv_" + std::to_string(W()));
  if (g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  auto cfg = base_config(2, 2);
  cfg["csv_monitor"] = {{"enabled", true}, {"output_path", dir.string()}, {"job_name", "job"}};
  cfg["steps_per_print"] = 2;
  cfg["wall_clock_breakdown"] = true;
  RunOptions o;
  o.steps = 3;
  train(cfg, g_world, o);
  if (g_world->rank() == 0) {
    std::ifstream f(dir / "job" / ds::engine::CsvMonitor::kFileName);
    ASSERT_TRUE(f.good());
    std::string line;
    std::getline(f, line);
    EXPECT_EQ(line, ds::engine::CsvMonitor::kHeader);
    int rows = 0;
    while (std::getline(f, line)) {
      ++rows;
      std::istringstream is(line);
      std::string step, samples;
      std::getline(is, step, ',');
      std::getline(is, samples, ',');
      EXPECT_EQ(std::stoi(step), rows);
      EXPECT_EQ(std::stoi(samples), rows * 2 * 2 * W());
    }
    EXPECT_EQ(rows, 3);
    fs::remove_all(dir);
  }
  g_world->barrier();
}

TEST(Engine, MemoryReportMatchesFormula) {
  // A model of 26 + extra parameters, fp16 Adam: the engine's allocation equals the ZeRO
  // formula up to the padding (P rounded up to 2W); stage-2 gradients are resident pages.
  for (int stage : {0, 1, 2}) {
    auto cfg = base_config(2, 1);
    cfg["fp16"] = {{"enabled", true}};
    cfg["zero_optimization"] = {{"stage", stage}};
    ds::test::TestMlp model(kD, kH, 7);
    auto r = ds::initialize(parse(cfg), model, g_world);
    const auto& m = r.engine->partition_map();
    const std::size_t P = m.total_numel, pad = m.padded_numel - m.total_numel;
    auto est = ds::engine::estimate_model_states_bytes(P, W(), stage, ds::DType::F16, 8);
    auto rep = r.engine->memory_report();
    EXPECT_LE(rep.params - est.params, 2 * pad + 2);
    EXPECT_LE(rep.master - est.master, 4 * pad + 4) << stage;
    EXPECT_LE(std::max(rep.optimizer_state, est.optimizer_state) - std::min(rep.optimizer_state, est.optimizer_state),
              8 * pad + 8) << stage;
    if (stage < 2 || W() == 1) {
      EXPECT_LE(rep.grads - est.grads, 2 * pad + 2);
    } else {
      // ZeRO-2: the resident pages of this rank's partition (this model is smaller than a
      // page, so that is one or two pages); Zero2ResidentGradientsArePartitionSized checks a
      // model of many pages against the formula.
      const auto gm = r.engine->gradient_memory();
      EXPECT_EQ(rep.grads, gm.partition);
      EXPECT_GE(rep.grads, est.grads);
      EXPECT_LE(rep.grads, 2 * ds::engine::PagedBuffer::page_size());
    }
  }
}

TEST(Engine, Stage3KeepsOnlyThePartition) {
  // Stage 3, fp16 Adam, nothing persistent: between steps a rank holds its partition of the
  // working params (2 bytes), of the reduced gradients (4) and of the master (4) and Adam's
  // state (8): the formula's 18P/N up to the padding; no page of the flat space stays
  // resident once a step is done. Parameters equal stage 0's within fp16 precision.
  for (bool grouped : {false, true}) {
    auto cfg = base_config(2, 2);
    cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}};
    cfg["zero_optimization"] = zero3();
    std::unique_ptr<ds::Engine> e;
    RunOptions o;
    o.steps = 3;
    o.extra_params = 7;
    o.grouped = grouped;
    train(cfg, g_world, o, &e);
    const auto& m = e->partition_map();
    const std::size_t P = m.total_numel, part = m.partition_numel;
    const auto rep = e->memory_report();
    EXPECT_EQ(rep.params, 2 * part) << grouped;
    EXPECT_EQ(rep.grads, 4 * part) << grouped;
    EXPECT_EQ(rep.master, 4 * part) << grouped;
    EXPECT_EQ(rep.optimizer_state, 8 * part) << grouped;
    const auto est = ds::engine::estimate_model_states_bytes(P, W(), 3, ds::DType::F16, 8);
    const std::size_t states = rep.total() - rep.comm_scratch;
    EXPECT_LE(est.total(), states);
    EXPECT_LE(states, est.total() + 18 * (part * std::size_t(W()) - P) + 18);
    // Reduce-scatter staging: two slots of the largest piece (fp16), only with other ranks.
    std::size_t piece = 0;
    for (const auto& g : m.groups) piece = std::max(piece, g.piece);
    EXPECT_EQ(rep.comm_scratch, W() > 1 ? 2 * piece * 2 : 0u);
  }
}

TEST(Engine, Zero2ResidentGradientsArePartitionSized) {
  // ZeRO-2 keeps the full-size bound gradient buffer as address space only. Measured with
  // mincore on that region (the test's own calls, besides the engine's report): after every
  // micro-step only this rank's partition pages are resident, within 5% of the formula's
  // 2P/N (4P/N fp32) plus the two pages it may share with its neighbours; during backward
  // at most three buckets (+ a tensor and two pages) come on top. Parameters
  // equal stage 1's (gas 2: the partition accumulates across micro-steps, so pages that were
  // released must read back as zero).
  if (W() == 1) GTEST_SKIP() << "stage 2 partitions only with more than one rank";
  const int L = 48, n = 3000;  // 144000 parameters: slices and buckets are not page-aligned
  const std::size_t P = std::size_t(L) * std::size_t(n), page = ds::engine::PagedBuffer::page_size();
  const std::size_t bucket = 10000;
  for (const std::string prec : {"fp32", "fp16", "bf16"}) {
    const std::size_t es = prec == "fp32" ? 4 : 2;
    std::vector<std::vector<float>> results;
    for (int stage : {1, 2}) {
      auto cfg = base_config(2, 2, true);
      if (prec != "fp32") cfg[prec] = {{"enabled", true}};
      if (prec == "fp16") cfg[prec]["initial_scale_power"] = 8;
      cfg["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", bucket}};
      ds::test::WideLinear model(L, n);
      auto r = ds::initialize(parse(cfg), model, g_world);
      auto& e = *r.engine;
      const auto gm = e.gradient_memory();
      auto* base = static_cast<char*>(model.grad(0).data);  // the region starts at parameter 0
      std::vector<unsigned char> vec(gm.reserved / page + 1);
      auto resident = [&] {
        if (mincore(base, gm.reserved, vec.data()) != 0) ADD_FAILURE() << "mincore failed";
        std::size_t k = 0;
        for (std::size_t i = 0; i < gm.reserved / page; ++i) k += vec[i] & 1u;
        return k * page;
      };
      std::size_t peak = 0;
      model.after_ready = [&] { peak = std::max(peak, resident()); };
      ds::test::Data data(64, 16);
      const int tb = int(e.train_batch_size());
      for (int s = 0; s < 3; ++s) {
        for (int k = 0; k < 2; ++k) {
          float l = e.forward(data.batch(s * tb + k * 2 * W() + g_world->rank() * 2, 2));
          e.backward(l);
          e.step();
          if (stage == 2) {
            EXPECT_EQ(resident(), gm.partition) << prec << " step " << s << " micro " << k;
          }
        }
      }
      results.push_back(e.gather_params_fp32());
      if (stage == 1) {
        EXPECT_EQ(gm.resident, gm.reserved) << prec;  // stage 1 keeps the whole buffer
        continue;
      }
      const double formula = double(es) * double(P) / W();
      EXPECT_GE(double(gm.partition), formula) << prec;
      EXPECT_LE(double(gm.partition), 1.05 * formula + double(2 * page)) << prec;
      // 1 bucket complete + 2 reducing, the tensor straddling into the next bucket (written
      // whole before the complete one can launch), and the pages shared at the ends.
      const std::size_t allowance = 3 * bucket * es + std::size_t(n) * es + 2 * page;
      EXPECT_GT(peak, gm.partition) << prec;  // buckets really were resident for a while
      EXPECT_LE(peak, gm.partition + allowance) << prec;
      const auto rep = e.memory_report();
      EXPECT_EQ(rep.grads, gm.partition) << prec;
      EXPECT_GE(rep.grads + rep.grad_buckets, peak) << prec;  // the engine samples at every release
      EXPECT_LE(rep.grad_buckets, allowance) << prec;
    }
    const double tol = prec == "fp32" ? 1e-5 : prec == "fp16" ? 4.0 / 1024 : 4.0 / 128;
    EXPECT_LT(max_abs_diff(results[0], results[1]), tol) << prec;
  }
}

TEST(Engine, BadConfigsFailAtInitialize) {
  ds::test::TestMlp model(kD, kH);
  auto expect_error = [&](json cfg, const std::string& needle) {
    try {
      ds::initialize(parse(cfg), model, g_world);
      ADD_FAILURE() << "no error for " << cfg.dump();
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto c = base_config(2, 1);
  c["optimizer"] = {{"type", "Lamb"}, {"params", {{"lr", 0.01}}}};
  c["fp16"] = {{"enabled", true}, {"loss_scale", 128}};
  expect_error(c, "loss_scale");
  c = base_config(2, 1);
  c["communication_data_type"] = "int8";
  expect_error(c, "communication_data_type");
  c = base_config(2, 1);
  c["train_batch_size"] = 2 * W() + 1;
  EXPECT_THROW(ds::initialize(parse(c), model, g_world), ds::Error);
  // The same error from a file path, unchanged.
  EXPECT_THROW(ds::initialize(std::string("/nonexistent/ds.json"), model, g_world), ds::Error);
}

// A module that says it runs on a CUDA device (the GPU path, tests/cuda/test_cuda_engine.cpp)
// where no GPU can be used: one clear error at initialize, naming what is missing.
class CudaClaimingMlp : public ds::test::TestMlp {
 public:
  using TestMlp::TestMlp;
  ds::Device device() const override { return ds::Device::Cuda; }
};

TEST(Engine, CudaModuleWithoutAGpuIsAClearError) {
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // hide any GPU (this process uses CUDA nowhere else)
  CudaClaimingMlp model(kD, kH);
  try {
    ds::initialize(parse(base_config(2, 1)), model, self());
    ADD_FAILURE() << "a CUDA module trained without a GPU";
  } catch (const ds::Error& e) {
    // Built with CUDA: the device allocation fails and says so; without: "built without CUDA".
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  if (W() > 1) {  // several ranks and no device communicator (NCCL or staged) given
    try {
      ds::initialize(parse(base_config(2, 1)), model, g_world);
      ADD_FAILURE() << "a CUDA module on " << W() << " ranks started without a device communicator";
    } catch (const ds::Error& e) {
      EXPECT_NE(std::string(e.what()).find("gradients need a device communicator"), std::string::npos) << e.what();
    }
  }
  // ZeRO-2 and ZeRO-3 pass the GPU path's limits (then find no device); ZeRO-3 with
  // offload_param is refused by them, naming the key.
  CudaClaimingMlp m2(kD, kH);
  auto c = base_config(2, 1);
  c["zero_optimization"] = {{"stage", 2}};
  try {
    ds::initialize(parse(c), m2, self());
    ADD_FAILURE() << "a CUDA module trained without a GPU at ZeRO-2";
  } catch (const ds::Error& e) {
    EXPECT_EQ(std::string(e.what()).find("zero_optimization.stage"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  c["zero_optimization"] = {{"stage", 3}};
  try {
    ds::initialize(parse(c), m2, self());
    ADD_FAILURE() << "a CUDA module trained without a GPU at ZeRO-3";
  } catch (const ds::Error& e) {
    EXPECT_EQ(std::string(e.what()).find("zero_optimization"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  c["zero_optimization"] = {{"stage", 3}, {"offload_param", {{"device", "cpu"}}}};
  try {
    ds::initialize(parse(c), m2, self());
    ADD_FAILURE() << "ZeRO-3 with offload_param accepted on the GPU path";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("zero_optimization.offload_param.device \"cpu\""), std::string::npos)
        << e.what();
  }
}

int main(int argc, char** argv) { return ds::test::mpi_gtest_main(argc, argv, g_world); }

// ---------------------------------------------------------------------------------------
// data_types.grad_accum_dtype
// ---------------------------------------------------------------------------------------

namespace {

// The gradient norm of one accumulation cycle summed without rounding: each micro-step's
// gradient is what the module writes into zeroed working-dtype views (scale loss_scale/gas,
// as the engine's backward), added up in double, unscaled. `params` are the engine's
// current parameters (exact in the working dtype).
double reference_norm(const ds::engine::PartitionMap& map, const std::vector<float>& params, const ds::test::Data& data,
                      int first, int micro, int gas, ds::DType dtype, double loss_scale) {
  ds::test::TestMlp model(kD, kH);
  const std::size_t n = map.total_numel, es = ds::dtype_size(dtype);
  std::vector<char> p(n * es), g(n * es);
  ds::convert(params.data(), ds::DType::F32, p.data(), dtype, n);
  std::vector<ds::TensorView> pv, gv;
  for (const auto& q : map.params) {
    pv.push_back(ds::TensorView{p.data() + q.offset * es, q.numel, dtype});
    gv.push_back(ds::TensorView{g.data() + q.offset * es, q.numel, dtype});
  }
  model.bind(pv, gv);
  std::vector<double> sum(n, 0.0);
  std::vector<float> gf(n);
  for (int k = 0; k < gas; ++k) {
    std::fill(g.begin(), g.end(), char(0));
    model.forward(data.batch(first + k * micro, micro));
    model.backward(float(loss_scale / gas), [](std::size_t) {});
    ds::convert(g.data(), dtype, gf.data(), ds::DType::F32, n);
    for (std::size_t i = 0; i < n; ++i) sum[i] += gf[i];
  }
  double sq = 0;
  for (double v : sum) sq += v * v;
  return std::sqrt(sq) / loss_scale;
}

// Half-precision training (prec "bf16" or "fp16" at a static loss scale of 256), gas
// micro-steps of one sample; the gradient norm of every boundary and, per boundary, the
// reference norm of the same cycle from the parameters before it.
struct NormTrace {
  std::vector<double> engine, reference;
  std::vector<float> params;
};
NormTrace half_norm_trace(const std::string& prec, const json& accum_dtype, int gas, int steps) {
  auto cfg = base_config(1, gas, true);
  cfg[prec] = {{"enabled", true}};
  if (prec == "fp16") cfg[prec]["loss_scale"] = 256;
  cfg["gradient_clipping"] = 0.0;
  if (!accum_dtype.is_null()) cfg["data_types"] = {{"grad_accum_dtype", accum_dtype}};
  ds::test::TestMlp model(kD, kH);
  auto r = ds::initialize(parse(cfg), model, self());
  auto& e = *r.engine;
  ds::test::Data data(steps * gas, kD);
  NormTrace t;
  for (int s = 0; s < steps; ++s) {
    t.reference.push_back(reference_norm(e.partition_map(), e.gather_params_fp32(), data, s * gas, 1, gas,
                                         e.working_dtype(), e.loss_scale()));
    for (int k = 0; k < gas; ++k) {
      e.backward(e.forward(data.batch(s * gas + k, 1)));
      e.step();
    }
    t.engine.push_back(e.get_global_grad_norm());
  }
  t.params = e.gather_params_fp32();
  return t;
}

}  // namespace

TEST(Engine, GradAccumDtypeFp32SumsMicroStepsInFp32) {
  // bf16 and fp16 working dtypes, gas 16. fp32 accumulation: the boundary's gradient norm
  // equals the exact sum of the half-precision micro-step gradients (relative 1e-6: fp32 vs
  // double adds; every cycle, so the buffer restarts from zero after each step).
  const int gas = 16, steps = 3;
  for (const std::string prec : {"bf16", "fp16"}) {
    const NormTrace fp32 = half_norm_trace(prec, "fp32", gas, steps);
    for (int s = 0; s < steps; ++s) {
      EXPECT_NEAR(fp32.engine[std::size_t(s)], fp32.reference[std::size_t(s)], 1e-6 * fp32.reference[std::size_t(s)])
          << prec << " step " << s;
    }
  }
  // bf16 accumulation (the default, and "bf16" written out) rounds after every add: its
  // norm is off by far more (0.3% here).
  const NormTrace fp32 = half_norm_trace("bf16", "fp32", gas, steps);
  const NormTrace dflt = half_norm_trace("bf16", json(), gas, steps);
  const NormTrace bf16 = half_norm_trace("bf16", "bf16", gas, steps);
  ASSERT_EQ(dflt.reference[0], fp32.reference[0]);  // the same parameters before step 1
  EXPECT_GT(std::fabs(dflt.engine[0] - dflt.reference[0]), 1e-4 * dflt.reference[0]);
  EXPECT_EQ(dflt.engine, bf16.engine);  // "bf16" is the working dtype: the default
  EXPECT_EQ(dflt.params, bf16.params);
}

TEST(Engine, GradAccumDtypeFp32EveryStageAndWorldSize) {
  // fp32 accumulation on W ranks (every stage reduces on every micro-step and folds the
  // reduced sum into the fp32 buffer) matches the same training on one rank with 2W x the
  // micro-batch. Tolerance 4 bf16 ulps at magnitude 1 (the per-micro-step reduction sums
  // the ranks' bf16 gradients in bf16), as ZeroStagesMatchStage0MixedPrecision.
  if (8 % (2 * W()) != 0) GTEST_SKIP() << "needs 2W dividing 8";
  RunOptions o;
  o.steps = 4;
  o.extra_params = 3;
  auto ref_cfg = base_config(8 / (2 * W()) * W(), 2, true);
  ref_cfg["bf16"] = {{"enabled", true}};
  ref_cfg["data_types"] = {{"grad_accum_dtype", "fp32"}};
  const auto ref = train(ref_cfg, self(), o);
  for (int stage : {0, 1, 2}) {
    auto cfg = base_config(8 / (2 * W()), 2, true);
    cfg["bf16"] = {{"enabled", true}};
    cfg["data_types"] = {{"grad_accum_dtype", "fp32"}};
    cfg["zero_optimization"] = {{"stage", stage}, {"reduce_bucket_size", 11}};
    std::unique_ptr<ds::Engine> e;
    EXPECT_LT(max_abs_diff(train(cfg, g_world, o, &e), ref), 4.0 / 128) << "stage " << stage;
    // The fp32 buffer is part of the gradients' bytes: one fp32 per element of the slice.
    ASSERT_TRUE(e);
    EXPECT_GE(e->memory_report().grads, e->partition_map().slices[std::size_t(e->comm().rank())].count * 4);
  }
}

TEST(Engine, GradAccumDtypeOtherHalfTypeIsAConfigError) {
  // A DsConfig built in code (not through the parser) gets the same answer from the engine.
  ds::test::TestMlp model(kD, kH);
  ds::config::DsConfig c = parse(base_config(2, 2));
  c.bf16.enabled = true;
  c.data_types.grad_accum_dtype = "fp16";
  try {
    ds::initialize(c, model, self());
    ADD_FAILURE() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_types.grad_accum_dtype 'fp16' is not supported with the bf16 working "
                                         "dtype; supported: fp32 or bf16"),
              std::string::npos)
        << e.what();
  }
}

TEST(Engine, GradAccumDtypeFp32OnTheGpuPathIsAClearError) {
  // The GPU path accumulates in the working dtype only; the check comes before any CUDA call.
  CudaClaimingMlp model(kD, kH);
  auto cfg = base_config(2, 2);
  cfg["bf16"] = {{"enabled", true}};
  cfg["data_types"] = {{"grad_accum_dtype", "fp32"}};
  try {
    ds::initialize(parse(cfg), model, self());
    ADD_FAILURE() << "no error";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("data_types.grad_accum_dtype fp32 with the bf16 working dtype: the GPU path "
                                         "accumulates gradients in the working dtype; remove the key or set it to bf16"),
              std::string::npos)
        << e.what();
  }
}

// ---------------------------------------------------------------------------------------
// The boundary step's outcome applied lazily (docs/dev/engine.md "The boundary step"): on a
// CUDA device the engine enqueues the step and applies its outcome (counters, loss scale,
// scheduler, grad norm, progress line) when something depends on it. The switch below makes
// the host store's outcome wait the same way, so this logic runs here, on the CPU.
// ---------------------------------------------------------------------------------------

namespace {

struct LazyCase {
  LazyCase(const char* n, json c) : name(n), cfg(std::move(c)) {}
  const char* name;
  json cfg;
  int steps = 6;
  std::set<int> inf_backward_rank0;  // backward calls writing inf gradients on rank 0
  std::set<int> nan_forward_last;    // forward calls returning NaN on the last rank
  bool grouped = false;
};

struct LazyRun {
  std::vector<std::uint32_t> params;  // the bits (a NaN parameter compares equal to itself)
  std::vector<double> seen;  // per step(): loss_scale, lr, grad norm, applied, skipped (when observed)
  std::int64_t skipped = 0, sched_iter = 0, global = 0;
  double scale = 0, lr = 0, norm = 0;
};

// Trains the case; `observe`: reads the outcome-dependent values after every step() (each read
// applies the outcome), else only at the end (each outcome is then applied by the next backward
// or boundary).
LazyRun lazy_run(const LazyCase& c, bool defer, bool observe) {
  ds::test::TestMlp model(kD, kH);
  model.grouped = c.grouped;
  if (g_world->rank() == 0) model.inf_grad_on_backward = c.inf_backward_rank0;
  if (g_world->rank() == W() - 1) model.nan_loss_on_forward = c.nan_forward_last;
  auto r = ds::initialize(parse(c.cfg), model, g_world);
  auto& e = *r.engine;
  // defer: the host store's outcomes wait like a device store's.
  e.set_test_switches({.defer_host_step_outcomes = defer});
  const int micro = int(e.train_micro_batch_size_per_gpu()), gas = int(e.gradient_accumulation_steps());
  const int tb = int(e.train_batch_size());
  ds::test::Data data(c.steps * tb, kD);
  LazyRun out;
  for (int s = 0; s < c.steps; ++s) {
    for (int k = 0; k < gas; ++k) {
      const int first = s * tb + k * micro * W() + g_world->rank() * micro;
      float loss = e.forward(data.batch(first, micro));
      e.backward(loss);
      e.step();
      if (observe) {
        out.seen.insert(out.seen.end(), {e.loss_scale(), e.get_lr(), e.get_global_grad_norm(),
                                         e.was_step_applied() ? 1.0 : 0.0, double(e.skipped_steps())});
      }
    }
  }
  for (float p : e.gather_params_fp32()) out.params.push_back(std::bit_cast<std::uint32_t>(p));
  out.skipped = e.skipped_steps();
  out.sched_iter = e.lr_scheduler()->last_batch_iteration();
  out.global = e.global_steps();
  out.scale = e.loss_scale();
  out.lr = e.get_lr();
  out.norm = e.get_global_grad_norm();
  return out;
}

std::vector<LazyCase> lazy_cases() {
  std::vector<LazyCase> cs;
  const json warmup = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}};
  for (int stage : {0, 2, 3}) {
    LazyCase c{"fp16 dynamic, overflow on rank 0", base_config(2, 1)};
    c.cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 10}, {"hysteresis", 1}, {"loss_scale_window", 2}};
    c.cfg["scheduler"] = warmup;
    c.cfg["zero_optimization"] = stage == 3 ? zero3() : json{{"stage", stage}};
    c.grouped = stage == 3;
    c.steps = 8;
    c.inf_backward_rank0 = {1, 4, 5};
    cs.push_back(c);
  }
  {
    LazyCase c{"fp16 dynamic, 2 accumulation steps, stage 1", base_config(1, 2, /*sgd=*/true)};
    c.cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 8}, {"hysteresis", 2}, {"loss_scale_window", 3}};
    c.cfg["scheduler"] = warmup;
    c.cfg["zero_optimization"] = {{"stage", 1}};
    c.inf_backward_rank0 = {3, 6, 7, 8};
    cs.push_back(c);
  }
  {
    // Real overflows: the scale halves until the gradients fit in fp16, so a backward that took
    // the scale before the last outcome was applied would overflow once more.
    LazyCase c{"fp16 from 2^24, overflowing until the scale fits", base_config(2, 1)};
    c.cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 24}, {"hysteresis", 1}};
    c.steps = 14;
    cs.push_back(c);
  }
  {
    LazyCase c{"fp16 static scale 128", base_config(2, 1)};
    c.cfg["fp16"] = {{"enabled", true}, {"loss_scale", 128}};
    c.cfg["scheduler"] = warmup;
    c.inf_backward_rank0 = {2};
    cs.push_back(c);
  }
  {
    LazyCase c{"bf16 without check_grad_overflow: inf gradients step, a NaN loss skips", base_config(2, 1)};
    c.cfg["bf16"] = {{"enabled", true}, {"check_grad_overflow", false}};
    c.cfg["scheduler"] = warmup;
    c.cfg["zero_optimization"] = {{"stage", 2}};
    c.inf_backward_rank0 = {4};  // applied: the parameters go NaN, as DeepSpeed's would
    c.nan_forward_last = {2};
    cs.push_back(c);
  }
  {
    LazyCase c{"fp32 SGD, no clipping, a NaN loss", base_config(2, 1, /*sgd=*/true)};
    c.cfg["gradient_clipping"] = 0.0;
    c.cfg["scheduler"] = warmup;
    c.nan_forward_last = {3};
    cs.push_back(c);
  }
  return cs;
}

}  // namespace

TEST(LazyStepOutcome, SameTrainingAsTheImmediateOutcome) {
  // The immediate outcome (the host path as it always was) against the deferred one, read after
  // every step and read only at the end: the same parameters bit for bit, the same per-step
  // values and counters. Fails when the boundary computes its lr before applying the previous
  // outcome, or backward takes the scale before it (both checked).
  for (const LazyCase& c : lazy_cases()) {
    const LazyRun ref = lazy_run(c, false, true);
    const LazyRun seen = lazy_run(c, true, true);
    const LazyRun quiet = lazy_run(c, true, false);
    EXPECT_EQ(seen.params, ref.params) << c.name;
    EXPECT_EQ(quiet.params, ref.params) << c.name;
    EXPECT_EQ(seen.seen, ref.seen) << c.name;
    for (const LazyRun* x : {&seen, &quiet}) {
      EXPECT_EQ(x->skipped, ref.skipped) << c.name;
      EXPECT_EQ(x->sched_iter, ref.sched_iter) << c.name;
      EXPECT_EQ(x->global, ref.global) << c.name;
      EXPECT_EQ(x->scale, ref.scale) << c.name;
      EXPECT_EQ(x->lr, ref.lr) << c.name;
      EXPECT_EQ(x->norm, ref.norm) << c.name;
    }
    EXPECT_GT(ref.skipped, 0) << c.name << ": the case must skip a step";
  }
}

TEST(LazyStepOutcome, AppliedWhenSomethingDependsOnIt) {
  // fp16, WarmupLR, the inf gradients of backward 1 on rank 0. The scheduler pointer kept from
  // initialize() shows whether the outcome was applied: not by step(), but by the first call
  // that depends on it.
  auto cfg = base_config(2, 1);
  cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 10}, {"hysteresis", 1}};
  cfg["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}};
  ds::test::TestMlp model(kD, kH);
  if (g_world->rank() == 0) model.inf_grad_on_backward = {1};
  auto r = ds::initialize(parse(cfg), model, g_world);
  r.engine->set_test_switches({.defer_host_step_outcomes = true});
  auto& e = *r.engine;
  ds::sched::LrScheduler* raw = r.lr_scheduler;
  ds::test::Data data(64, kD);
  const auto it0 = raw->last_batch_iteration();
  auto run_step = [&](int s) {
    float l = e.forward(data.batch(2 * s, 2));
    e.backward(l);
    e.step();
  };
  run_step(0);
  EXPECT_EQ(raw->last_batch_iteration(), it0) << "applied by step() itself";
  const double lr1 = e.get_lr();  // applies it
  EXPECT_EQ(raw->last_batch_iteration(), it0 + 1);
  EXPECT_TRUE(e.was_step_applied());
  EXPECT_EQ(e.get_lr(), lr1);  // once
  EXPECT_EQ(raw->last_batch_iteration(), it0 + 1);
  run_step(1);  // overflow on rank 0: skipped on every rank
  EXPECT_EQ(raw->last_batch_iteration(), it0 + 1);
  EXPECT_FALSE(e.was_step_applied());
  EXPECT_EQ(e.skipped_steps(), 1);
  EXPECT_EQ(e.loss_scale(), 512);
  EXPECT_EQ(e.get_global_grad_norm(), -1.0);
  EXPECT_EQ(e.get_lr(), lr1) << "the scheduler stepped on a skipped step";
  run_step(2);
  run_step(3);  // step 2's outcome applied by step 3's backward (the fp16 scale) at the latest
  EXPECT_EQ(raw->last_batch_iteration(), it0 + 2);
  EXPECT_TRUE(e.was_step_applied());
  EXPECT_EQ(raw->last_batch_iteration(), it0 + 3);
  EXPECT_EQ(e.global_steps(), 4);
}

TEST(LazyStepOutcome, AccumulationStepAfterAnUnresolvedBoundaryIsNotApplied) {
  // gas 2: step() at a boundary, then step() of the next cycle's first micro-batch (not a
  // boundary) before anything applied the boundary's outcome: was_step_applied() says false,
  // as it does when the outcome is applied at once; the boundary itself still counts as applied.
  // Fails when applying the late outcome overwrites the later "not applied" (checked).
  auto cfg = base_config(1, 2);
  ds::test::TestMlp model(kD, kH);
  auto r = ds::initialize(parse(cfg), model, g_world);
  r.engine->set_test_switches({.defer_host_step_outcomes = true});
  auto& e = *r.engine;
  ds::test::Data data(64, kD);
  for (int k = 0; k < 3; ++k) {
    float l = e.forward(data.batch(k, 1));
    e.backward(l);
    e.step();
  }
  EXPECT_FALSE(e.was_step_applied());
  EXPECT_EQ(e.skipped_steps(), 0);
  EXPECT_EQ(e.global_steps(), 1);
  float l = e.forward(data.batch(3, 1));
  e.backward(l);
  e.step();
  EXPECT_TRUE(e.was_step_applied());
  EXPECT_EQ(e.global_steps(), 2);
}

TEST(LazyStepOutcome, StuckScaleErrorSurfacesWhereTheOutcomeIsApplied) {
  // fp16 from scale 2 with min 1 and inf gradients every step: the second overflow sits at the
  // minimum. Deferred, step() does not throw; the first call that applies the outcome does, with
  // LossScaler's message.
  auto cfg = base_config(2, 1);
  cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 1}, {"hysteresis", 1}, {"min_loss_scale", 1}};
  ds::test::TestMlp model(kD, kH);
  model.inf_grad_on_backward = {0, 1, 2, 3};
  auto r = ds::initialize(parse(cfg), model, g_world);
  r.engine->set_test_switches({.defer_host_step_outcomes = true});
  auto& e = *r.engine;
  ds::test::Data data(64, kD);
  for (int s = 0; s < 2; ++s) {
    float l = e.forward(data.batch(2 * s, 2));
    EXPECT_NO_THROW(e.backward(l)) << "step " << s;
    EXPECT_NO_THROW(e.step()) << "step " << s;
  }
  std::string msg;
  try {
    (void)e.loss_scale();
  } catch (const ds::Error& err) {
    msg = err.what();
  }
  EXPECT_NE(msg.find("min_loss_scale"), std::string::npos) << msg;
  EXPECT_EQ(e.skipped_steps(), 1) << "the stuck outcome was applied (or tried) twice";
}

TEST(LazyStepOutcome, CheckpointSaveAppliesTheOutcome) {
  // A save right after step() writes the counters, scale and scheduler with the last outcome
  // applied: a fresh engine that loads it reports what the immediate run reports.
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dstrain_lazy_ckpt_" + std::to_string(W()));
  if (g_world->rank() == 0) fs::remove_all(dir);
  g_world->barrier();
  LazyCase c{"fp16 with an overflow at the last step", base_config(2, 1)};
  c.cfg["fp16"] = {{"enabled", true}, {"initial_scale_power", 10}, {"hysteresis", 1}};
  c.cfg["scheduler"] = {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}, {"warmup_type", "linear"}}}};
  c.steps = 3;
  c.inf_backward_rank0 = {2};
  const LazyRun ref = lazy_run(c, false, false);
  {
    ds::test::TestMlp model(kD, kH);
    if (g_world->rank() == 0) model.inf_grad_on_backward = c.inf_backward_rank0;
    auto r = ds::initialize(parse(c.cfg), model, g_world);
    r.engine->set_test_switches({.defer_host_step_outcomes = true});
    ds::test::Data data(c.steps * int(r.engine->train_batch_size()), kD);
    for (int s = 0; s < c.steps; ++s) {
      float l = r.engine->forward(data.batch(s * 2 * W() + g_world->rank() * 2, 2));
      r.engine->backward(l);
      r.engine->step();
    }
    r.engine->save_checkpoint(dir.string(), "t");
  }
  ds::test::TestMlp model(kD, kH);
  auto r = ds::initialize(parse(c.cfg), model, g_world);
  ASSERT_TRUE(r.engine->load_checkpoint(dir.string(), "t").has_value());
  EXPECT_EQ(r.engine->skipped_steps(), ref.skipped);
  EXPECT_EQ(r.engine->skipped_steps(), 1);
  EXPECT_EQ(r.engine->loss_scale(), ref.scale);
  EXPECT_EQ(r.engine->get_lr(), ref.lr);
  std::vector<std::uint32_t> loaded;
  for (float p : r.engine->gather_params_fp32()) loaded.push_back(std::bit_cast<std::uint32_t>(p));
  EXPECT_EQ(loaded, ref.params);
  g_world->barrier();
  if (g_world->rank() == 0) fs::remove_all(dir);
}
