// The Optimizer classes: trajectories against PyTorch 1.13 (golden file made by
// scripts/make_torch_goldens.py), factory validation, state tensors, checkpoint round trip.
//
// Tolerance against torch: |ours - torch| <= 1e-6 * max(1, |p|) after 20 steps. Both compute
// in fp32; SGD uses torch's operation order (fused add-with-alpha) and matches bitwise; Adam
// and Adagrad round in a different order (torch: sqrt(v)/sqrt(bc2); ours, DeepSpeedCPUAdam:
// sqrt(v)*(1/sqrt(bc2)) with FMAs), a few ulps per step (seen: <= 6e-8, and 5e-7 for AdamW
// with weight decay: torch rounds its decay factor 1 - lr*wd to fp32 before multiplying,
// DeepSpeed applies p += (-lr*wd)*p in one fused operation).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ds/core/error.h"
#include "ds/optim/optimizer.h"

using ds::DType;
using ds::TensorView;
using ds::config::OptimizerConfig;
using namespace ds::optim;

namespace {

OptimizerConfig from_json(const nlohmann::json& j) {
  OptimizerConfig c;
  c.type = j.at("type").get<std::string>();
  if (c.type == "adagrad") { c.lr = 1e-2; c.eps = 1e-10; }  // torch defaults, as the config parser fills them
  c.lr = j.value("lr", c.lr);
  if (j.contains("betas")) c.betas = {j["betas"][0].get<double>(), j["betas"][1].get<double>()};
  c.eps = j.value("eps", c.eps);
  c.weight_decay = j.value("weight_decay", c.weight_decay);
  c.adam_w_mode = j.value("adam_w_mode", c.adam_w_mode);
  c.momentum = j.value("momentum", c.momentum);
  c.dampening = j.value("dampening", c.dampening);
  c.nesterov = j.value("nesterov", c.nesterov);
  c.lr_decay = j.value("lr_decay", c.lr_decay);
  c.initial_accumulator_value = j.value("initial_accumulator_value", c.initial_accumulator_value);
  return c;
}

nlohmann::json load_golden() {
  std::ifstream f(std::string(DS_OPTIM_GOLDEN_DIR) + "/torch_optim_trajectories.json");
  if (!f) throw std::runtime_error("cannot open the golden file in " DS_OPTIM_GOLDEN_DIR);
  return nlohmann::json::parse(f);
}

std::string error_of(const OptimizerConfig& c) {
  try { make_optimizer(c); } catch (const ds::Error& e) { return e.what(); }
  return {};
}

}  // namespace

TEST(Optimizers, TrajectoriesMatchTorch113) {
  const nlohmann::json doc = load_golden();
  const std::size_t n = doc["numel"].get<std::size_t>();
  const auto init = doc["init"].get<std::vector<float>>();
  const auto grads = doc["grads"].get<std::vector<std::vector<float>>>();
  ASSERT_GE(doc["cases"].size(), 7u);
  for (const auto& cs : doc["cases"]) {
    const OptimizerConfig cfg = from_json(cs["config"]);
    const auto expect = cs["params"].get<std::vector<std::vector<float>>>();
    for (Kernel k : {Kernel::Ref, Kernel::Cpu}) {
      auto opt = make_optimizer(cfg, k);
      opt->init_state(n);
      std::vector<float> p = init;
      double worst = 0;
      for (std::size_t s = 0; s < grads.size(); ++s) {
        std::vector<float> g = grads[s];
        StepContext ctx;
        ctx.lr = cfg.lr;
        ctx.step = std::int64_t(s) + 1;
        opt->step(p, TensorView{g.data(), n, DType::F32}, TensorView{}, {}, ctx);
        for (std::size_t i = 0; i < n; ++i) {
          const double err = std::fabs(double(p[i]) - expect[s][i]) / std::max(1.0, std::fabs(double(expect[s][i])));
          worst = std::max(worst, err);
        }
      }
      EXPECT_LE(worst, 1e-6) << cs["name"] << (k == Kernel::Ref ? " (ref)" : " (cpu)");
      std::printf("%-14s %s: worst relative difference to torch over %zu steps: %.2e\n",
                  cs["name"].get<std::string>().c_str(), k == Kernel::Ref ? "ref" : "cpu", grads.size(), worst);
      // The trajectory really moved (a test that cannot fail is no test).
      EXPECT_GT(std::fabs(p[1] - init[1]), 1e-3) << cs["name"];
    }
  }
}

TEST(Optimizers, NamesAndStateTensors) {
  OptimizerConfig c;
  auto adam = make_optimizer(c);
  EXPECT_EQ(adam->name(), "adam");
  adam->init_state(10);
  auto st = adam->state_tensors();
  ASSERT_EQ(st.size(), 2u);
  EXPECT_EQ(st[0].first, "exp_avg");
  EXPECT_EQ(st[1].first, "exp_avg_sq");
  EXPECT_EQ(st[0].second.size(), 10u);
  c.type = "sgd";
  auto sgd = make_optimizer(c);
  sgd->init_state(4);
  EXPECT_TRUE(sgd->state_tensors().empty());  // no momentum: no state
  c.momentum = 0.9;
  auto sgdm = make_optimizer(c);
  sgdm->init_state(4);
  ASSERT_EQ(sgdm->state_tensors().size(), 1u);
  EXPECT_EQ(sgdm->state_tensors()[0].first, "momentum_buffer");
  c.type = "adagrad";
  c.initial_accumulator_value = 0.5;
  auto ada = make_optimizer(c);
  ada->init_state(3);
  EXPECT_EQ(ada->state_tensors()[0].first, "sum");
  EXPECT_EQ(ada->state_tensors()[0].second[2], 0.5f);
  c.type = "lamb";
  EXPECT_EQ(make_optimizer(c)->name(), "lamb");
  c.type = "adamw";
  EXPECT_EQ(make_optimizer(c)->name(), "adamw");
}

// Every optimizer's state names come from the one list in ds/optim/params.h (the config's
// descriptors and the memory estimate read it too).
TEST(Optimizers, StateNamesAreTheParamsList) {
  for (const char* type : {"adam", "adamw", "sgd", "lamb", "adagrad"}) {
    for (double momentum : {0.0, 0.9}) {
      OptimizerConfig c;
      c.type = type;
      c.momentum = momentum;
      EXPECT_EQ(make_optimizer(c)->state_names(), optimizer_state_names(c)) << type << " momentum " << momentum;
    }
  }
  OptimizerConfig c;
  c.type = "lamb";
  EXPECT_EQ(optimizer_state_names(c), (std::vector<std::string>{"exp_avg", "exp_avg_sq"}));
  c.type = "adagrad";
  EXPECT_EQ(optimizer_state_names(c), std::vector<std::string>{"sum"});
  c.type = "rmsprop";
  EXPECT_TRUE(optimizer_state_names(c).empty());
}

TEST(Optimizers, AdamWModeDefaultIsDecoupled) {
  // "adam" with default adam_w_mode == "adamw"; adam_w_mode=false is L2 and differs.
  OptimizerConfig a, w, l2;
  a.weight_decay = w.weight_decay = l2.weight_decay = 0.1;
  w.type = "adamw";
  l2.adam_w_mode = false;
  std::vector<float> pa(64, 1.f), pw(64, 1.f), pl(64, 1.f), g(64, 0.01f);
  for (auto* x : {&a, &w, &l2}) {
    auto o = make_optimizer(*x);
    o->init_state(64);
    std::vector<float>& p = x == &a ? pa : x == &w ? pw : pl;
    StepContext ctx; ctx.lr = 1e-2;
    o->step(p, TensorView{g.data(), 64, DType::F32}, {}, {}, ctx);
  }
  EXPECT_EQ(pa, pw);
  EXPECT_NE(pa, pl);
}

TEST(Optimizers, CheckpointRoundTripContinuesBitwise) {
  for (const char* type : {"adam", "sgd", "adagrad", "lamb"}) {
    OptimizerConfig c;
    c.type = type;
    c.momentum = std::string(type) == "sgd" ? 0.9 : 0.0;
    const std::size_t n = 5000;
    std::vector<float> p(n), g(n);
    for (std::size_t i = 0; i < n; ++i) { p[i] = std::sin(0.1f * i); g[i] = std::cos(0.37f * i); }
    const std::vector<Segment> segs = {{0, 1000}, {1000, 4000}};
    auto a = make_optimizer(c);
    a->init_state(n);
    StepContext ctx; ctx.lr = 1e-2;
    for (int s = 1; s <= 3; ++s) { ctx.step = s; a->step(p, TensorView{g.data(), n, DType::F32}, {}, segs, ctx); }
    std::vector<float> p2 = p;
    auto b = make_optimizer(c);
    b->init_state(n);
    auto sa = a->state_tensors(), sb = b->state_tensors();
    ASSERT_EQ(sa.size(), sb.size());
    for (std::size_t k = 0; k < sa.size(); ++k) std::copy(sa[k].second.begin(), sa[k].second.end(), sb[k].second.begin());
    for (int s = 4; s <= 6; ++s) {
      ctx.step = s;
      a->step(p, TensorView{g.data(), n, DType::F32}, {}, segs, ctx);
      b->step(p2, TensorView{g.data(), n, DType::F32}, {}, segs, ctx);
    }
    EXPECT_EQ(p, p2) << type;
  }
}

TEST(Optimizers, LambReportsCoeffsPerSegment) {
  OptimizerConfig c;
  c.type = "lamb";
  auto o = make_optimizer(c);
  const std::size_t n = 300;
  o->init_state(n);
  std::vector<float> p(n, 0.f), g(n, 1.f);
  for (std::size_t i = 100; i < n; ++i) p[i] = 1000.f;  // huge ||p||/||u||: clamped to max_coeff
  const std::vector<Segment> segs = {{0, 100}, {100, 200}};
  StepContext ctx; ctx.lr = 1e-3;
  o->step(p, TensorView{g.data(), n, DType::F32}, {}, segs, ctx);
  ASSERT_EQ(o->last_lamb_coeffs().size(), 2u);
  EXPECT_EQ(o->last_lamb_coeffs()[0], 1.f);   // ||p|| = 0
  EXPECT_EQ(o->last_lamb_coeffs()[1], 10.f);  // max_coeff
}

TEST(Optimizers, BetasOverrideFromScheduler) {
  OptimizerConfig c;
  std::vector<float> p1(32, 1.f), p2(32, 1.f), g(32, 0.5f);
  auto a = make_optimizer(c), b = make_optimizer(c);
  // (a constant gradient would make bias-corrected Adam independent of the betas)
  a->init_state(32);
  b->init_state(32);
  StepContext ctx; ctx.lr = 1e-2;
  for (int s = 1; s <= 2; ++s) {
    ctx.step = s;
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = s == 1 ? 0.5f : -0.25f * float(i % 5);
    ctx.betas.reset();
    a->step(p1, TensorView{g.data(), 32, DType::F32}, {}, {}, ctx);
    ctx.betas = std::array<double, 2>{0.8, 0.99};
    b->step(p2, TensorView{g.data(), 32, DType::F32}, {}, {}, ctx);
  }
  EXPECT_NE(p1, p2);
}

TEST(Optimizers, ValidationNamesTheKey) {
  OptimizerConfig c;
  c.type = "rmsprop";
  EXPECT_NE(error_of(c).find("optimizer.type"), std::string::npos);
  c = {};
  c.lr = -1;
  EXPECT_NE(error_of(c).find("optimizer.params.lr"), std::string::npos);
  c = {};
  c.betas = {1.0, 0.999};
  EXPECT_NE(error_of(c).find("optimizer.params.betas[0]"), std::string::npos);
  c = {};
  c.type = "sgd";
  c.nesterov = true;
  EXPECT_NE(error_of(c).find("optimizer.params.nesterov"), std::string::npos);
  c = {};
  c.type = "lamb";
  c.min_coeff = 20;
  EXPECT_NE(error_of(c).find("optimizer.params.min_coeff"), std::string::npos);
  c = {};
  c.type = "adagrad";
  c.lr_decay = -0.5;
  EXPECT_NE(error_of(c).find("optimizer.params.lr_decay"), std::string::npos);
}

TEST(Optimizers, MisuseIsAnError) {
  auto o = make_optimizer(OptimizerConfig{});
  std::vector<float> p(8), g(8);
  StepContext ctx;
  EXPECT_THROW(o->step(p, TensorView{g.data(), 8, DType::F32}, {}, {}, ctx), ds::Error);  // before init_state
  o->init_state(8);
  EXPECT_THROW(o->step(p, TensorView{g.data(), 7, DType::F32}, {}, {}, ctx), ds::Error);
  std::vector<double> gd(8);
  EXPECT_THROW(o->step(p, TensorView{gd.data(), 8, DType::F64}, {}, {}, ctx), ds::Error);
  ctx.step = 0;
  EXPECT_THROW(o->step(p, TensorView{g.data(), 8, DType::F32}, {}, {}, ctx), ds::Error);
  OptimizerConfig l;
  l.type = "lamb";
  auto lamb = make_optimizer(l);
  lamb->init_state(8);
  ctx.step = 1;
  const std::vector<Segment> overlap = {{0, 5}, {4, 4}};
  EXPECT_THROW(lamb->step(p, TensorView{g.data(), 8, DType::F32}, {}, overlap, ctx), ds::Error);
}

// step_piece (NVMe offload's streamed step): every elementwise optimizer stepped over
// caller-held state in uneven pieces gives what one step() over the whole range gives, bit
// for bit, from the initial state values it reports; Lamb refuses.
TEST(Optimizers, StepPiecesEqualOneStep) {
  const std::size_t n = 1000;
  const std::vector<nlohmann::json> configs{
      {{"type", "adam"}, {"lr", 0.01}, {"weight_decay", 0.01}},
      {{"type", "adamw"}, {"lr", 0.01}, {"weight_decay", 0.1}},
      {{"type", "sgd"}, {"lr", 0.05}, {"momentum", 0.9}},
      {{"type", "sgd"}, {"lr", 0.05}},
      {{"type", "adagrad"}, {"lr", 0.05}, {"initial_accumulator_value", 0.25}}};
  for (const auto& j : configs) {
    OptimizerConfig c = from_json(j);
    auto whole = make_optimizer(c), pieces = make_optimizer(c);
    whole->init_state(n);
    const auto names = pieces->state_names();
    std::vector<std::vector<float>> state(names.size(), std::vector<float>(n));
    for (std::size_t i = 0; i < names.size(); ++i)
      std::fill(state[i].begin(), state[i].end(), pieces->initial_state_value(i));
    std::vector<float> m1(n), m2(n), g(n);
    std::vector<std::uint16_t> w1(n), w2(n);
    for (std::size_t i = 0; i < n; ++i) {
      m1[i] = m2[i] = std::sin(float(i)) * 0.5f;
      g[i] = std::cos(float(i) * 0.7f) * 0.1f;
    }
    for (int s = 1; s <= 3; ++s) {
      StepContext ctx;
      ctx.lr = 0.01;
      ctx.step = s;
      ctx.grad_scale = 0.5;
      whole->step(m1, TensorView{g.data(), n, DType::F32}, TensorView{w1.data(), n, DType::BF16}, {}, ctx);
      for (std::size_t a = 0, k = 1; a < n; a += k, k = k * 3 + 1) {  // pieces of 1, 4, 13, 40, ...
        const std::size_t len = std::min(k, n - a);
        std::vector<float*> st;
        for (auto& v : state) st.push_back(v.data() + a);
        pieces->step_piece(std::span<float>(m2.data() + a, len), TensorView{g.data() + a, len, DType::F32},
                           TensorView{w2.data() + a, len, DType::BF16}, st, ctx);
      }
    }
    EXPECT_EQ(m1, m2) << j.dump();
    EXPECT_EQ(w1, w2) << j.dump();
    auto ws = whole->state_tensors();
    ASSERT_EQ(ws.size(), state.size()) << j.dump();
    for (std::size_t i = 0; i < ws.size(); ++i) {
      EXPECT_EQ(ws[i].first, names[i]);
      EXPECT_TRUE(std::equal(ws[i].second.begin(), ws[i].second.end(), state[i].begin())) << j.dump() << " " << names[i];
    }
  }
  auto lamb = make_optimizer(from_json({{"type", "lamb"}}));
  std::vector<float> m(4), st0(4), st1(4), g(4);
  std::vector<float*> st{st0.data(), st1.data()};
  StepContext ctx;
  EXPECT_THROW(lamb->step_piece(m, TensorView{g.data(), 4, DType::F32}, TensorView{}, st, ctx), ds::Error);
}
