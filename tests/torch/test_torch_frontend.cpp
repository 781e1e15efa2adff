// A C++ torch::nn::Module with a loss function (ds/torch/torch_frontend.h) trained by the
// engine: losses against a plain libtorch loop (torch::optim::SGD, the same initial weights
// and batches) at the run's rank count, in fp32 and bf16, the names, and the errors naming
// the module.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/config/parse.h"
#include "ds/engine/engine.h"
#include "ds/torch/torch_frontend.h"
#include "../common/temp_dir.h"
#include "torch_test_env.h"

using ds::test::g_world;
using ds::test::RegressionData;
using nlohmann::json;

namespace {

// Linear-ReLU-Linear on the regression data (6 inputs, 3 outputs), with a buffer of ones
// (not a parameter; in the module's dtype only when the module itself is cast).
struct Mlp : ::torch::nn::Module {
  Mlp() : ::torch::nn::Module("Mlp") {
    ::torch::manual_seed(0);  // every instance starts from the same weights
    fc1 = register_module("fc1", ::torch::nn::Linear(RegressionData::kIn, 16));
    fc2 = register_module("fc2", ::torch::nn::Linear(16, RegressionData::kOut));
    gain = register_buffer("gain", ::torch::ones({16}));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(::torch::relu(fc1->forward(x)) * gain); }
  ::torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  at::Tensor gain;
};

// In fp32 also when the module runs in bf16 (the targets are fp32; no bf16 mse_loss on the CPU).
at::Tensor mse(Mlp& net, const at::Tensor& inputs, const at::Tensor& targets) {
  return ::torch::mse_loss(net.forward(inputs).to(at::kFloat), targets);
}

constexpr double kLr = 0.05, kMomentum = 0.9;
constexpr int kSteps = 10;

// libtorch alone: SGD with momentum on the whole batch of each step.
std::vector<double> libtorch_losses(const RegressionData& data) {
  auto net = std::make_shared<Mlp>();
  ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(kLr).momentum(kMomentum));
  const int B = RegressionData::kBatch;
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    auto x = ::torch::from_blob(const_cast<float*>(data.x.data()) + s * B * RegressionData::kIn,
                                {B, RegressionData::kIn});
    auto y = ::torch::from_blob(const_cast<float*>(data.y.data()) + s * B * RegressionData::kOut,
                                {B, RegressionData::kOut});
    opt.zero_grad();
    at::Tensor loss = mse(*net, x, y);
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// The engine on every rank of the run, each rank its share of the same global batches.
std::vector<double> engine_losses(const RegressionData& data, const json& extra) {
  auto module = ds::torch::from_module(std::make_shared<Mlp>(), mse);
  const int W = g_world->size(), micro = RegressionData::kBatch / W;
  json cfg{{"train_micro_batch_size_per_gpu", micro},
           {"gradient_accumulation_steps", 1},
           {"optimizer", {{"type", "SGD"}, {"params", {{"lr", kLr}, {"momentum", kMomentum}}}}},
           {"gradient_clipping", 0.0}};
  cfg.update(extra);
  auto r = ds::initialize(ds::config::parse_config_json(cfg), *module, g_world);
  std::vector<double> losses;
  for (int s = 0; s < kSteps; ++s) {
    float loss = r.engine->forward(data.batch(s * RegressionData::kBatch + g_world->rank() * micro, micro));
    r.engine->backward(loss);
    r.engine->step();
    g_world->all_reduce(ds::TensorView{&loss, 1, ds::DType::F32}, ds::ReduceOp::Sum);
    losses.push_back(double(loss) / W);
  }
  return losses;
}

}  // namespace

TEST(TorchFrontend, ParametersAreNamedParameters) {
  auto m = ds::torch::from_module(std::make_shared<Mlp>(), mse);
  const auto ps = m->parameters();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].name, "fc1.weight");
  EXPECT_EQ(ps[0].shape, (std::vector<std::int64_t>{16, RegressionData::kIn}));
  EXPECT_EQ(ps[3].name, "fc2.bias");
  EXPECT_EQ(m->path(), "C++ module Mlp");
}

// fp32, ZeRO 0 and 3: every step's loss within 1e-5 relative of libtorch's own loop.
TEST(TorchFrontend, EngineMatchesLibtorchSgd) {
  if (RegressionData::kBatch % g_world->size() != 0) GTEST_SKIP() << "batch over " << g_world->size();
  RegressionData data;
  const std::vector<double> ref = libtorch_losses(data);
  for (int stage : {0, 3}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(stage));
    const std::vector<double> ours = engine_losses(data, {{"zero_optimization", {{"stage", stage}}}});
    ASSERT_EQ(ours.size(), ref.size());
    for (std::size_t s = 0; s < ref.size(); ++s) EXPECT_NEAR(ours[s], ref[s], 1e-5 * std::fabs(ref[s])) << s;
    EXPECT_LT(ours.back(), ours.front());
  }
}

// bf16 working parameters: the adapter casts the whole C++ module, buffers included (an
// fp32 buffer would make fc2's input fp32 against bf16 weights); losses follow fp32
// libtorch to bf16's precision.
TEST(TorchFrontend, Bf16CastsTheModule) {
  if (RegressionData::kBatch % g_world->size() != 0) GTEST_SKIP() << "batch over " << g_world->size();
  RegressionData data;
  const std::vector<double> ref = libtorch_losses(data);
  const std::vector<double> ours = engine_losses(data, {{"bf16", {{"enabled", true}}}});
  ASSERT_EQ(ours.size(), ref.size());
  for (std::size_t s = 0; s < ref.size(); ++s) EXPECT_NEAR(ours[s], ref[s], 1e-2 * std::fabs(ref[s])) << s;
}

// The loss function's result is checked as the scripted forward's is, and what libtorch
// throws inside it names the module.
TEST(TorchFrontend, ErrorsNameTheModule) {
  RegressionData data;
  auto per_sample = [](Mlp& net, const at::Tensor& x, const at::Tensor& y) {
    return (net.forward(x) - y).pow(2).mean(1);
  };
  auto vec = ds::torch::from_module(std::make_shared<Mlp>(), per_sample);
  EXPECT_HAS(error_of([&] { vec->forward(data.batch(0, 8)); }),
             "C++ module Mlp: forward must return the mean loss as a floating-point scalar");
  auto wrong = [](Mlp& net, const at::Tensor& x, const at::Tensor& y) { return mse(net, x.t(), y); };
  auto bad = ds::torch::from_module(std::make_shared<Mlp>(), wrong);
  EXPECT_HAS(error_of([&] { bad->forward(data.batch(0, 8)); }), "C++ module Mlp: loss_fn_(module, inputs, targets): mat1 and mat2 shapes cannot be multiplied");
  const ds::torch::LossFn sum = [](::torch::nn::Module&, const at::Tensor& x, const at::Tensor&) { return x.sum(); };
  EXPECT_HAS(error_of([&] { ds::torch::from_module(std::make_shared<::torch::nn::Module>("Empty"), sum); }),
             "C++ module Empty: the module has no parameters to train");
}
