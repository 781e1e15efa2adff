// TorchModule on its own (no engine): the contract checks at load, parameter names and
// initial values, gradients accumulated into the bound views, readiness from autograd's
// hooks during backward, and the parameters an unused branch leaves without a gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <vector>

#include "ds/torch/torch_module.h"
#include "../common/temp_dir.h"
#include "torch_test_env.h"

using ds::test::Bound;
using ds::test::RegressionData;
using ds::test::torch_model;
using ds::torch::TorchModule;

TEST(TorchModule, ParametersAreNamedParametersInOrder) {
  TorchModule m(torch_model("regression"));
  const auto ps = m.parameters();
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[0].name, "fc1.weight");
  EXPECT_EQ(ps[0].shape, (std::vector<std::int64_t>{16, 6}));
  EXPECT_EQ(ps[3].name, "fc2.bias");
  EXPECT_EQ(ps[3].numel(), 3u);
}

// A range alone gets the same values as the whole model (stage 3 initialises group by group).
TEST(TorchModule, InitParameterRangeGivesTheModulesValues) {
  TorchModule whole_model(torch_model("regression"));
  const Bound whole(whole_model);
  TorchModule m(torch_model("regression"));
  std::vector<float> w(whole.params[2].size()), b(whole.params[3].size());
  const std::vector<std::span<float>> spans{w, b};
  EXPECT_TRUE(m.init_parameter_range(2, spans, 0));
  EXPECT_EQ(w, whole.params[2]);
  EXPECT_EQ(b, whole.params[3]);
  EXPECT_THROW(m.init_parameter_range(3, spans, 0), ds::Error);
}

// backward(scale) adds scale * gradient into the bound views: twice the same batch with
// scales 1 and 2 gives three times the first gradient, in the same memory.
TEST(TorchModule, BackwardAccumulatesIntoTheBoundViews) {
  TorchModule m(torch_model("regression"));
  Bound s(m);
  RegressionData data;
  const float loss = m.forward(data.batch(0, 8));
  EXPECT_GT(loss, 0.0f);
  m.backward(1.0f, [](std::size_t) {});
  const std::vector<float> once = s.grads[0];
  EXPECT_NE(once[0], 0.0f);
  EXPECT_FLOAT_EQ(m.forward(data.batch(0, 8)), loss);
  m.backward(2.0f, [](std::size_t) {});
  for (std::size_t k = 0; k < once.size(); ++k)
    EXPECT_NEAR(s.grads[0][k], 3 * once[k], 1e-5f * (1 + std::fabs(once[k])));
}

// The parameters the engine writes are the ones the module computes with.
TEST(TorchModule, ForwardReadsTheBoundParameters) {
  TorchModule m(torch_model("regression"));
  Bound s(m);
  RegressionData data;
  const float before = m.forward(data.batch(0, 8));
  for (float& w : s.params[2]) w = 0.0f;  // fc2.weight: the output is the bias alone
  for (float& b : s.params[3]) b = 0.0f;
  double expect = 0;
  for (int k = 0; k < 8 * RegressionData::kOut; ++k) expect += double(data.y[std::size_t(k)]) * data.y[std::size_t(k)];
  const float after = m.forward(data.batch(0, 8));
  EXPECT_NE(after, before);
  EXPECT_NEAR(after, expect / (8 * RegressionData::kOut), 1e-5);
}

// Readiness comes from autograd as it goes: fc2 (used last in forward) before fc1, each once.
TEST(TorchModule, GradReadyFollowsAutogradOrder) {
  TorchModule m(torch_model("regression"));
  Bound s(m);
  RegressionData data;
  m.forward(data.batch(0, 8));
  std::vector<std::size_t> order;
  m.backward(1.0f, [&](std::size_t i) { order.push_back(i); });
  ASSERT_EQ(order.size(), 4u);
  EXPECT_GE(order[0], 2u);
  EXPECT_GE(order[1], 2u);
  EXPECT_LT(order[2], 2u);
  EXPECT_LT(order[3], 2u);
}

// A second bind moves the views: the gradients land in the new storage only, and each
// parameter is still reported once (the accumulators, the same in the same dtype, keep one hook).
TEST(TorchModule, RebindMovesTheViews) {
  TorchModule m(torch_model("regression"));
  Bound first(m);
  Bound second(m);
  RegressionData data;
  m.forward(data.batch(0, 8));
  std::vector<int> count(m.parameters().size(), 0);
  m.backward(1.0f, [&](std::size_t i) { ++count[i]; });
  for (std::size_t i = 0; i < count.size(); ++i) EXPECT_EQ(count[i], 1) << m.parameters()[i].name;
  for (float g : first.grads[3]) EXPECT_EQ(g, 0.0f);
  EXPECT_NE(second.grads[3][0], 0.0f);
}

// A branch forward does not take: its parameters are reported too (at the end), unchanged.
TEST(TorchModule, UnusedBranchIsReported) {
  TorchModule m(torch_model("unused"));
  Bound s(m);
  RegressionData data;
  m.forward(data.batch(0, 8));
  std::vector<int> count(m.parameters().size(), 0);
  m.backward(1.0f, [&](std::size_t i) { ++count[i]; });
  for (std::size_t i = 0; i < count.size(); ++i) EXPECT_EQ(count[i], 1) << m.parameters()[i].name;
  EXPECT_EQ(m.parameters()[2].name, "extra.weight");
  for (float g : s.grads[2]) EXPECT_EQ(g, 0.0f);
}

// forward runs in train mode (dropout draws a new mask each call), evaluate in eval mode
// without autograd (the same loss every time), and forward after evaluate trains again.
TEST(TorchModule, EvaluateRunsInEvalMode) {
  TorchModule m(torch_model("dropout"));
  Bound s(m);
  RegressionData data;
  const float a = m.forward(data.batch(0, 8)), b = m.forward(data.batch(0, 8));
  EXPECT_NE(a, b);
  const float e1 = m.evaluate(data.batch(0, 8)), e2 = m.evaluate(data.batch(0, 8));
  EXPECT_EQ(e1, e2);
  EXPECT_NE(m.forward(data.batch(0, 8)), e1);
  m.backward(1.0f, [](std::size_t) {});
}

TEST(TorchModule, IntegerTargetsAreClassIds) {
  TorchModule m(torch_model("classifier"));
  Bound s(m);
  RegressionData data;
  const float loss = m.forward(data.class_batch());
  EXPECT_GT(loss, 0.5f);  // about ln 4 for an untrained 4-way classifier
  EXPECT_LT(loss, 3.0f);
}

namespace {

// The loss form `name` and its logits twin `name`_logits (same weights): the same loss,
// gradients and validation loss on `b`.
void expect_logits_form_matches(const std::string& name, const ds::Batch& b) {
  TorchModule loss_form(torch_model(name)), logits_form(torch_model(name + "_logits"));
  Bound with_loss(loss_form), with_logits(logits_form);
  const float loss = loss_form.forward(b);
  EXPECT_GT(loss, 0.5f) << name;
  EXPECT_FLOAT_EQ(logits_form.forward(b), loss) << name;
  loss_form.backward(1.0f, [](std::size_t) {});
  logits_form.backward(1.0f, [](std::size_t) {});
  for (std::size_t i = 0; i < with_loss.grads.size(); ++i)
    for (std::size_t k = 0; k < with_loss.grads[i].size(); ++k)
      ASSERT_NEAR(with_logits.grads[i][k], with_loss.grads[i][k], 1e-6f * (1 + std::fabs(with_loss.grads[i][k])))
          << name << " " << loss_form.parameters()[i].name << "[" << k << "]";
  EXPECT_FLOAT_EQ(logits_form.evaluate(b), loss_form.evaluate(b)) << name;
}

}  // namespace

// forward(inputs) -> logits: the cross-entropy the adapter applies equals the module's own,
// for class ids [batch] (logits [batch, classes]) and tokens [batch, seq] ([batch, seq, vocab]).
TEST(TorchModule, LogitsFormGivesTheLossFormsLosses) {
  RegressionData data;
  expect_logits_form_matches("classifier", data.class_batch());

  std::vector<std::int32_t> tokens(2 * 17);
  for (std::size_t k = 0; k < tokens.size(); ++k) tokens[k] = std::int32_t((k * 37 + 11) % 256);
  ds::Batch text;
  text.batch = 2;
  text.seq = 16;
  text.inputs = std::span<const std::int32_t>(tokens).subspan(0, 32);
  text.targets = std::span<const std::int32_t>(tokens).subspan(2, 32);
  expect_logits_form_matches("lm", text);
}

// Logits need class ids: float targets are an error naming the file, before forward runs.
TEST(TorchModule, LogitsFormRefusesFloatTargets) {
  const std::string path = torch_model("classifier_logits");
  TorchModule m(path);
  Bound s(m);
  RegressionData data;
  EXPECT_HAS(error_of([&] { m.forward(data.batch(0, 8)); }),
             path + ": forward(inputs) returns logits, which need class ids as targets");
}

TEST(TorchModule, ContractErrorsNameTheFile) {
  TempDir dir("ds_torch");
  const std::string text = (dir.path / "notes.pt").string();
  std::ofstream(text) << "not a model\n";
  EXPECT_HAS(error_of([&] { TorchModule m(text); }), text + " is not a TorchScript module");
  EXPECT_HAS(error_of([&] { TorchModule m((dir.path / "absent.pt").string()); }), "does not exist");
  const std::string arity = torch_model("wrong_arity");
  EXPECT_HAS(error_of([&] { TorchModule m(arity); }),
             arity + ": forward must be forward(self, inputs: Tensor, targets");
  EXPECT_HAS(error_of([&] { TorchModule m(torch_model("no_params")); }), "no parameters");
  TorchModule vec(torch_model("vector_loss"));
  Bound s(vec);
  RegressionData data;
  EXPECT_HAS(error_of([&] { vec.forward(data.batch(0, 8)); }),
             "forward must return the mean loss as a floating-point scalar");
}

// A module that swaps a parameter's memory for its own copy is stopped after that backward.
TEST(TorchModule, ReplacedParameterMemoryIsAnError) {
  TorchModule m(torch_model("replaces_data"));
  Bound s(m);
  RegressionData data;
  m.forward(data.batch(0, 8));
  EXPECT_HAS(error_of([&] { m.backward(1.0f, [](std::size_t) {}); }),
             "after backward, fc1.weight's data is no longer the engine's memory");
}

// What libtorch throws inside the scripted forward arrives as ds::Error naming the file and
// the message's last line (here: a batch of the wrong width).
TEST(TorchModule, LibtorchErrorsBecomeDsErrors) {
  TorchModule m(torch_model("regression"));
  Bound s(m);
  RegressionData data;
  std::vector<std::int64_t> wide{3};
  ds::Batch b = data.batch(0, 8);
  b.features = b.features.subspan(0, 8 * 3);
  b.sample_shape = wide;
  const std::string err = error_of([&] { m.forward(b); });
  EXPECT_HAS(err, torch_model("regression") + ": module.forward");
  EXPECT_HAS(err, "shapes cannot be multiplied");
}
