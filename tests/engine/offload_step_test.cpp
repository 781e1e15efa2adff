// ZeRO-Offload on the GPU path, the parts that run on the CPU:
//   - HostOffloadStep (src/engine/src/device_offload_store.h) with a memcpy copier standing in
//     for the device: over several steps, at awkward sizes and sub-group sizes, for every
//     working dtype and Adam / SGD with momentum / Adagrad / Lamb (with segments), the master,
//     the optimizer state and the "device" params equal those of one Kernel::Cpu step over the
//     whole partition bit for bit; the copies cover the partition exactly once each way, in
//     sub-group order; each sub-group is stepped after its gradients have landed and
//     copied back before the next sub-group is stepped (Lamb: one step after every gradient
//     copy, the copies back after it).
//   - Engine::check_device_limits with a module claiming a CUDA device (no GPU needed):
//     offload_optimizer nvme is refused naming the key; cpu at stage 1 passes the limits (the
//     error is then the missing device); cpu at stage 2 is refused naming the stage (the GPU
//     path offloads at stage 1 only).
//   - The memory report says where the master and the optimizer state live.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device_offload_store.h"
#include "ds/config/parse.h"
#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/engine/engine.h"
#include "ds/engine/memory.h"
#include "ds/optim/optimizer.h"
#include "test_model.h"

namespace {

using ds::DType;
using ds::TensorView;
using ds::engine::HostOffloadStep;

struct Op {
  char kind;  // 'd' grads_to_host, 'w' wait_grads, 'h' params_to_device, 'p' wait_params
  std::size_t piece = 0, begin = 0, count = 0;
  // The master elements the optimizer had changed when the op was issued: none (changed_end
  // 0), or some below changed_end (one past the last changed element).
  std::size_t changed_end = 0;
  bool stepped() const { return changed_end > 0; }
};

// The "device": a gradient array and a params array of n elements; copies are memcpys, logged
// with how far the master differs from `before` (how far the step has run) at that moment.
class FakeCopier final : public ds::engine::OffloadCopier {
 public:
  FakeCopier(std::vector<char>& dev_grads, std::vector<char>& dev_params, TensorView host_grads, TensorView staging,
             std::vector<Op>& log, const std::vector<float>* master = nullptr)
      : dg_(dev_grads), dp_(dev_params), hg_(host_grads), st_(staging), log_(log), master_(master) {}
  std::vector<float> before;  // the master when the step began
  void grads_to_host(std::size_t piece, std::size_t begin, std::size_t count) override {
    const std::size_t es = ds::dtype_size(hg_.dtype);
    std::memcpy(static_cast<char*>(hg_.data) + begin * es, dg_.data() + begin * es, count * es);
    log_.push_back({'d', piece, begin, count, changed_end()});
  }
  void wait_grads(std::size_t piece) override { log_.push_back({'w', piece, 0, 0, changed_end()}); }
  void params_to_device(std::size_t piece, std::size_t begin, std::size_t count) override {
    const std::size_t es = ds::dtype_size(st_.dtype);
    std::memcpy(dp_.data() + begin * es, static_cast<const char*>(st_.data) + begin * es, count * es);
    log_.push_back({'h', piece, begin, count, changed_end()});
  }
  void wait_params() override { log_.push_back({'p', 0, 0, 0, changed_end()}); }

 private:
  std::size_t changed_end() const {
    if (!master_ || before.size() != master_->size()) return 0;
    for (std::size_t i = before.size(); i > 0; --i)
      if (std::memcmp(&before[i - 1], &(*master_)[i - 1], sizeof(float)) != 0) return i;
    return 0;
  }
  std::vector<char>& dg_;
  std::vector<char>& dp_;
  TensorView hg_, st_;
  std::vector<Op>& log_;
  const std::vector<float>* master_;
};

ds::optim::OptimizerParams optimizer(const std::string& type) {
  ds::optim::OptimizerParams p;
  p.type = type;
  p.lr = type == "sgd" ? 0.05 : 0.01;
  p.weight_decay = 0.01;
  if (type == "sgd") p.momentum = 0.9;
  return p;
}

std::vector<char> as_dtype(const std::vector<float>& v, DType t) {
  std::vector<char> out(v.size() * ds::dtype_size(t));
  ds::convert(v.data(), DType::F32, out.data(), t, v.size());
  return out;
}

void check_one(const std::string& type, DType wdtype, std::size_t n, std::size_t sub_group) {
  SCOPED_TRACE(type + " " + std::string(ds::dtype_name(wdtype)) + " n=" + std::to_string(n) +
               " sub_group=" + std::to_string(sub_group));
  const std::size_t es = ds::dtype_size(wdtype);
  std::mt19937 rng(unsigned(n * 131 + sub_group));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> init(n);
  for (auto& x : init) x = nd(rng);
  // Lamb's trust ratio is per segment: three uneven tensors and a gap the step must skip.
  std::vector<ds::optim::Segment> segments;
  if (type == "lamb" && n >= 8) segments = {{0, n / 3}, {n / 3, n / 2 - n / 3}, {n / 2 + 1, n - n / 2 - 1}};

  // Reference: one Kernel::Cpu step over the whole partition, in place.
  auto ref = ds::optim::make_optimizer(optimizer(type), ds::optim::Kernel::Cpu);
  ref->init_state(n);
  std::vector<float> ref_master = init;
  std::vector<char> ref_params = as_dtype(init, wdtype);

  // Offloaded: host master/state/grad copy/staging, the fake device's grads and params.
  auto opt = ds::optim::make_optimizer(optimizer(type), ds::optim::Kernel::Cpu);
  opt->init_state(n);
  std::vector<Op> log;
  std::vector<float> master = init;
  // The staging buffer starts as the working params (as the store's upload() fills it): Lamb
  // never writes elements outside its segments, and the copy back sends them all.
  std::vector<char> dev_params = as_dtype(init, wdtype), dev_grads(n * es), host_grads(n * es),
                    staging = as_dtype(init, wdtype);
  const TensorView hg{host_grads.data(), n, wdtype}, st{staging.data(), n, wdtype};
  FakeCopier copier(dev_grads, dev_params, hg, st, log, &master);
  const HostOffloadStep plan(n, sub_group);
  const std::size_t pieces = plan.pieces();
  ASSERT_EQ(pieces, sub_group == 0 ? 1 : (n + sub_group - 1) / sub_group);

  for (int s = 1; s <= 3; ++s) {
    std::vector<float> g(n);
    for (auto& x : g) x = nd(rng) * 64.f;
    dev_grads = as_dtype(g, wdtype);
    ds::optim::StepContext ctx;
    ctx.lr = 0.01 * s;
    ctx.step = s;
    ctx.grad_scale = 1.0 / 64.0;
    ref->step(ref_master, TensorView{dev_grads.data(), n, wdtype}, TensorView{ref_params.data(), n, wdtype}, segments,
              ctx);
    log.clear();
    std::fill(host_grads.begin(), host_grads.end(), char(0x7f));  // stale values must not survive
    copier.before = master;
    plan.step(*opt, master, hg, st, segments, ctx, copier);

    // The order: wait_params; d 0..P-1 covering [0, n) in order, before any step. Then, for
    // the elementwise optimizers, for each i: w i (nothing from sub-group i on stepped yet),
    // h i (sub-group i stepped, nothing after it: its copy back is issued before sub-group
    // i+1 is stepped). Lamb: w 0..P-1 before the one step, h 0..P-1 after it.
    ASSERT_EQ(log.size(), 3 * pieces + 1);
    EXPECT_EQ(log[0].kind, 'p');
    EXPECT_FALSE(log[0].stepped());
    std::size_t next = 0;
    for (std::size_t i = 0; i < pieces; ++i) {
      const Op& d = log[1 + i];
      EXPECT_EQ(d.kind, 'd');
      EXPECT_FALSE(d.stepped());
      EXPECT_EQ(d.piece, i);
      EXPECT_EQ(d.begin, next);
      EXPECT_GT(d.count, 0u);
      if (sub_group != 0 && i + 1 < pieces) {
        EXPECT_EQ(d.count, sub_group);
      }
      next = d.begin + d.count;
    }
    EXPECT_EQ(next, n);
    const bool whole = type == "lamb";
    for (std::size_t i = 0; i < pieces; ++i) {
      const Op& d = log[1 + i];
      const Op& w = whole ? log[1 + pieces + i] : log[1 + pieces + 2 * i];
      const Op& h = whole ? log[1 + 2 * pieces + i] : log[2 + pieces + 2 * i];
      EXPECT_EQ(w.kind, 'w');
      EXPECT_EQ(w.piece, i);
      EXPECT_EQ(h.kind, 'h');
      EXPECT_EQ(h.piece, i);
      EXPECT_EQ(h.begin, d.begin);
      EXPECT_EQ(h.count, d.count);
      if (whole) {
        EXPECT_FALSE(w.stepped()) << "sub-group " << i;
        EXPECT_TRUE(h.stepped()) << "sub-group " << i;
      } else {
        EXPECT_LE(w.changed_end, d.begin) << "sub-group " << i << " stepped before its gradients arrived";
        EXPECT_GT(h.changed_end, d.begin) << "sub-group " << i << " copied back before its step";
        EXPECT_LE(h.changed_end, d.begin + d.count) << "sub-group " << i + 1 << " stepped before " << i
                                                    << "'s copy back was issued";
      }
    }

    // Bit for bit: master, state, and the params the device holds now.
    ASSERT_EQ(0, std::memcmp(master.data(), ref_master.data(), n * sizeof(float))) << "master, step " << s;
    ASSERT_EQ(0, std::memcmp(dev_params.data(), ref_params.data(), n * es)) << "device params, step " << s;
    auto a = opt->state_tensors(), b = ref->state_tensors();
    ASSERT_EQ(a.size(), b.size());
    for (std::size_t k = 0; k < a.size(); ++k)
      ASSERT_EQ(0, std::memcmp(a[k].second.data(), b[k].second.data(), n * sizeof(float)))
          << a[k].first << ", step " << s;
  }
}

TEST(HostOffloadStep, MatchesOneWholeStepBitForBit) {
  for (const char* type : {"adamw", "sgd", "adagrad", "lamb"})
    for (DType t : {DType::F32, DType::BF16, DType::F16})
      for (std::size_t n : {std::size_t(1), std::size_t(7), std::size_t(1000), std::size_t(4099)})
        for (std::size_t sub : {std::size_t(0), std::size_t(1), std::size_t(3), std::size_t(64), std::size_t(1000),
                                std::size_t(5000)}) {
          if (sub == 1 && n > 1000) continue;  // 4099 one-element pieces add nothing but time
          check_one(type, t, n, sub);
        }
}

TEST(HostOffloadStep, PiecesAndSizeChecks) {
  const HostOffloadStep empty(0, 16);
  EXPECT_EQ(empty.pieces(), 0u);
  const HostOffloadStep p(10, 4);
  ASSERT_EQ(p.pieces(), 3u);
  EXPECT_EQ(p.piece(2), (std::pair<std::size_t, std::size_t>{8, 2}));
  const HostOffloadStep whole(10, 0), big(10, 100);
  EXPECT_EQ(whole.pieces(), 1u);
  EXPECT_EQ(big.pieces(), 1u);
  EXPECT_EQ(big.piece(0), (std::pair<std::size_t, std::size_t>{0, 10}));
  // A partition of another size is a programming error, reported with the sizes.
  auto opt = ds::optim::make_optimizer(optimizer("adam"), ds::optim::Kernel::Cpu);
  opt->init_state(10);
  std::vector<float> master(9), g(10), w(10);
  std::vector<Op> log;
  std::vector<char> dg(40), dp(40);
  FakeCopier c(dg, dp, TensorView{g.data(), 10, DType::F32}, TensorView{w.data(), 10, DType::F32}, log);
  try {
    p.step(*opt, master, TensorView{g.data(), 10, DType::F32}, TensorView{w.data(), 10, DType::F32}, {}, {}, c);
    ADD_FAILURE() << "a 9-element master was accepted for a 10-element partition";
  } catch (const ds::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected 10"), std::string::npos) << e.what();
  }
}

TEST(OffloadMemoryReport, SaysWhereMasterAndOptimizerLive) {
  ds::engine::ModelStateBytes b;
  b.master = 4 << 20;
  EXPECT_EQ(b.to_string().find("host memory"), std::string::npos) << b.to_string();
  b.optimizer_offloaded = true;
  EXPECT_NE(b.to_string().find("optimizer 0.0 KiB (master and optimizer in host memory)"), std::string::npos)
      << b.to_string();
}

// ---- the GPU path's config limits, checked without a GPU ----

class CudaClaimingMlp : public ds::test::TestMlp {
 public:
  using TestMlp::TestMlp;
  ds::Device device() const override { return ds::Device::Cuda; }
};

std::string init_error(int stage, const std::string& offload_device) {
  nlohmann::json j{{"train_micro_batch_size_per_gpu", 2},
                   {"optimizer", {{"type", "Adam"}, {"params", {{"lr", 0.01}}}}},
                   {"zero_optimization", {{"stage", stage}}}};
  ds::config::DsConfig cfg = ds::config::parse_config_json(j);
  // Set directly: the test does not depend on how the parser spells or checks the section.
  cfg.zero_optimization.offload_optimizer.device = offload_device;
  if (offload_device == "nvme") cfg.zero_optimization.offload_optimizer.nvme_path = "/tmp";
  CudaClaimingMlp model(3, 5);
  try {
    ds::initialize(cfg, model, std::make_shared<ds::test::SelfComm>());
  } catch (const ds::Error& e) {
    return e.what();
  }
  return "";
}

TEST(OffloadGpuLimits, NvmeIsRefusedCpuPassesTheLimits) {
  ::setenv("CUDA_VISIBLE_DEVICES", "", 1);  // no GPU in this process, whatever the machine has
  const std::string nvme = init_error(1, "nvme");
  EXPECT_NE(nvme.find("zero_optimization.offload_optimizer.device \"nvme\""), std::string::npos) << nvme;
  EXPECT_NE(nvme.find("set zero_optimization.offload_optimizer.device to \"cpu\""), std::string::npos) << nvme;
  // cpu at stage 1: past the limits, the store finds no device (or no CUDA in the build).
  const std::string cpu = init_error(1, "cpu");
  EXPECT_EQ(cpu.find("offload_optimizer"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("CUDA"), std::string::npos) << cpu;
  // Offload at stage 2 on the GPU path is refused naming the stage.
  const std::string s2 = init_error(2, "cpu");
  EXPECT_NE(s2.find("zero_optimization.stage"), std::string::npos) << s2;
}

}  // namespace

// The early gradient copies (one per reduced bucket) cover a sub-group only when together they
// hold every element of it; the step then waits for them instead of copying again.
TEST(HostOffloadStep, EarlyCopiesCoverASubGroupOnlyWhole) {
  using ds::engine::EarlyCopy;
  using ds::engine::covered_by;
  const std::vector<EarlyCopy> none;
  EXPECT_FALSE(covered_by(none, 0, 10));
  const std::vector<EarlyCopy> buckets{{90, 100, nullptr}, {40, 90, nullptr}, {0, 40, nullptr}};  // from the end
  EXPECT_TRUE(covered_by(buckets, 0, 100));
  EXPECT_TRUE(covered_by(buckets, 35, 45));
  EXPECT_TRUE(covered_by(buckets, 99, 100));
  const std::vector<EarlyCopy> gap{{90, 100, nullptr}, {0, 40, nullptr}};  // a bucket missing
  EXPECT_FALSE(covered_by(gap, 0, 100));
  EXPECT_FALSE(covered_by(gap, 39, 41));
  EXPECT_TRUE(covered_by(gap, 90, 100));
  EXPECT_FALSE(covered_by(gap, 90, 101));
}
