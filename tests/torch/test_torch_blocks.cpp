// ZeRO stage 3 over a TorchScript model given as a sequence of blocks, on the module alone:
// which models get one group per block, and hooks that make a released group's parameters
// NaN (as released pages would be gone) to show that the adapter reads a block's
// parameters only inside its brackets, in forward and in backward, and releases a group in
// backward only once its gradients are final.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "ds/torch/torch_module.h"
#include "torch_test_env.h"

using ds::test::Bound;
using ds::test::RegressionData;
using ds::test::torch_model;
using ds::torch::TorchModule;

namespace {

std::vector<std::string> group_names(const TorchModule& m) {  // "name@first+count"
  std::vector<std::string> names;
  for (const auto& g : m.parameter_groups())
    names.push_back(g.name + "@" + std::to_string(g.first) + "+" + std::to_string(g.count));
  return names;
}

// Stage 3 as the module sees it: a group's parameters hold their values only while acquired
// (NaN otherwise); each backward release records the group's gradients at that moment.
class PoisonHooks final : public ds::GroupHooks {
 public:
  PoisonHooks(Bound& storage, std::vector<ds::ParamGroup> groups)
      : s_(storage), groups_(std::move(groups)), refs_(groups_.size(), 0), saved_(storage.params),
        grads_at_release_(storage.grads) {
    for (std::size_t g = 0; g < groups_.size(); ++g) poison(g);
  }
  void acquire(std::size_t g, ds::Pass pass) override {
    log_.push_back(tag(g, pass, '+'));
    if (refs_[g]++ == 0)
      for (std::size_t i = first(g); i < end(g); ++i)
        std::copy(saved_[i].begin(), saved_[i].end(), s_.params[i].begin());
    held_most_ = std::max(held_most_, held());
  }
  void release(std::size_t g, ds::Pass pass) noexcept override {
    log_.push_back(tag(g, pass, '-'));
    if (--refs_[g] > 0) return;
    if (pass == ds::Pass::Backward)
      for (std::size_t i = first(g); i < end(g); ++i) grads_at_release_[i] = s_.grads[i];
    poison(g);
  }
  std::size_t held() const {
    return std::size_t(std::count_if(refs_.begin(), refs_.end(), [](int r) { return r > 0; }));
  }
  std::size_t held_most() const { return held_most_; }  // groups acquired at once, at most
  std::vector<std::string> take_log() { return std::exchange(log_, {}); }
  const std::vector<std::vector<float>>& grads_at_release() const { return grads_at_release_; }

 private:
  std::size_t first(std::size_t g) const { return groups_[g].first; }
  std::size_t end(std::size_t g) const { return groups_[g].first + groups_[g].count; }
  static std::string tag(std::size_t g, ds::Pass pass, char sign) {
    std::string t(1, pass == ds::Pass::Forward ? 'F' : 'B');
    t += sign;
    t += std::to_string(g);
    return t;
  }
  void poison(std::size_t g) {
    for (std::size_t i = first(g); i < end(g); ++i) {
      saved_[i] = s_.params[i];
      std::fill(s_.params[i].begin(), s_.params[i].end(), std::numeric_limits<float>::quiet_NaN());
    }
  }
  Bound& s_;
  std::vector<ds::ParamGroup> groups_;
  std::vector<int> refs_;
  std::vector<std::vector<float>> saved_, grads_at_release_;
  std::vector<std::string> log_;
  std::size_t held_most_ = 0;
};

// `model` with the poisoning hooks against the same model without: the same losses and
// gradients, each group acquired for one block at a time in forward and in order in backward.
void expect_bracketed(const std::string& model, const ds::Batch& batch) {
  SCOPED_TRACE(model);
  TorchModule plain(torch_model(model));
  Bound ref(plain);
  const float ref_loss = plain.forward(batch);
  plain.backward(1.0f, [](std::size_t) {});
  const float ref_eval = plain.evaluate(batch);

  TorchModule m(torch_model(model));
  Bound s(m);
  const std::size_t n_groups = m.parameter_groups().size();
  PoisonHooks hooks(s, m.parameter_groups());
  m.set_group_hooks(&hooks);
  EXPECT_EQ(m.forward(batch), ref_loss);
  std::vector<std::string> want;
  for (std::size_t g = 0; g < n_groups; ++g) {
    want.push_back("F+" + std::to_string(g));
    want.push_back("F-" + std::to_string(g));
  }
  EXPECT_EQ(hooks.take_log(), want);
  EXPECT_EQ(hooks.held_most(), 1u);

  m.backward(1.0f, [](std::size_t) {});
  std::vector<std::string> acquired;
  for (const auto& e : hooks.take_log())
    if (e[1] == '+') acquired.push_back(e);
  std::vector<std::string> want_acquired;
  for (std::size_t g = n_groups; g-- > 0;) want_acquired.push_back("B+" + std::to_string(g));
  EXPECT_EQ(acquired, want_acquired);
  EXPECT_LE(hooks.held_most(), 2u);  // the block running and, at most, the one after it
  EXPECT_EQ(hooks.held(), 0u);
  // Last-bit differences: the module's forward runs as one graph (its autodiff), the blocks one by one.
  for (std::size_t i = 0; i < ref.grads.size(); ++i)
    for (std::size_t k = 0; k < ref.grads[i].size(); ++k)
      ASSERT_NEAR(s.grads[i][k], ref.grads[i][k], 1e-5 * (1e-3 + std::fabs(ref.grads[i][k]))) << i << " " << k;
  EXPECT_EQ(hooks.grads_at_release(), s.grads);  // final when released
  EXPECT_EQ(m.evaluate(batch), ref_eval);
  EXPECT_EQ(hooks.held(), 0u);
}

}  // namespace

TEST(TorchBlocks, SequenceOfBlocksGetsOneGroupPerBlock) {
  // A Sequential (split into its calls; its Tanh has no parameters), a ModuleList's items, a head.
  EXPECT_EQ(group_names(TorchModule(torch_model("blocks"))),
            (std::vector<std::string>{"stem.0@0+2", "blocks.0@2+2", "blocks.1@4+2", "head@6+2"}));
  // A top-level nn.Sequential (the logits form).
  EXPECT_EQ(group_names(TorchModule(torch_model("blocks_logits"))), (std::vector<std::string>{"0@0+2", "2@2+2"}));
  // Children called in order, the loss from the last output and the targets.
  EXPECT_EQ(group_names(TorchModule(torch_model("lm"))), (std::vector<std::string>{"wte@0+1", "head@1+2"}));
}

TEST(TorchBlocks, OtherModelsAreOneGroup) {
  // Work between the calls (tanh), a branch, work before the first call (unsqueeze).
  for (const char* model : {"regression", "unused", "digits_cnn"})
    EXPECT_TRUE(TorchModule(torch_model(model)).parameter_groups().empty()) << model;
}

TEST(TorchBlocks, ParametersAreReadOnlyInsideTheirBrackets) {
  RegressionData data;
  expect_bracketed("blocks", data.batch(0, 8));
  expect_bracketed("blocks_logits", data.class_batch());
}
