// ZeRO-3 on a device, the GroupFetcher's device branch on the CPU: a Zero3Store that behaves as
// DevicePartitionedParamStore does towards the fetcher -- flat spaces whose unmapped ranges are
// PROT_NONE host memory (a write or read the fetcher did not map first crashes the test, as a
// kernel would fault on an unmapped chunk), releases deferred behind fake stream events that
// complete one step late (so re-acquires cancel queued releases), the compute "stream" ordered
// behind a gather instead of the host waiting -- over a fake 2-rank communicator whose
// operations complete only when waited, oldest first (reading a gathered group before the
// fetcher ordered it reads zeros: caught by the value checks). The module's calls are played
// as a decoder makes them: forward acquires / releases in order, backward in reverse with
// gradient writes and grad_ready, a group backward never touches, 2 micro-steps, a step.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "add_into_f32.h"
#include "deferred_release.h"
#include "ds/core/error.h"
#include "ds/core/timer.h"
#include "zero3_fetcher.h"
#include "zero3_space.h"

namespace {

using ds::DType;
using ds::TensorView;
using ds::engine::DeferredReleases;
using ds::engine::ReleaseEvents;

constexpr std::size_t kAlign = std::size_t(2) << 20;  // groups start on 2 MiB (partition.cpp)

// Events complete when the test advances the stream (one step behind the host by default).
struct LaggingStream final : ReleaseEvents {
  std::uint64_t recorded = 0, completed = 0;
  std::uint64_t record() override { return ++recorded; }
  bool done(std::uint64_t e) override { return e <= completed; }
  void wait(std::uint64_t e) override { completed = std::max(completed, e); }
  void drop(std::uint64_t) noexcept override {}
  void lag_one() { completed = recorded > 0 ? recorded - 1 : 0; }
};

// Two ranks that hold the same pieces: rank 0's view of them. Operations run when waited (in
// start order, as the Communicator's rule says), not when started.
class MirrorComm final : public ds::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string_view backend() const override { return "mirror"; }
  void all_reduce(TensorView, ds::ReduceOp) override { fail(); }
  ds::CommWork iall_reduce(TensorView, ds::ReduceOp) override { fail(); }
  void reduce_scatter(TensorView, TensorView, ds::ReduceOp) override { fail(); }
  void all_gather(TensorView, TensorView) override { fail(); }
  void broadcast(TensorView, int) override { fail(); }
  void barrier() override {}
  ds::CommWork ireduce_scatter(TensorView send, TensorView recv, ds::ReduceOp) override {
    // Both ranks sent the same: rank 0's block summed twice.
    return start([send, recv] {
      const float* s = send.as<float>();
      float* r = static_cast<float*>(recv.data);
      for (std::size_t i = 0; i < recv.count; ++i) r[i] = 2 * s[i];
    });
  }
  ds::CommWork iall_gather(TensorView send, TensorView recv) override {
    return start([send, recv] {
      for (std::size_t b = 0; b < 2; ++b)
        std::memcpy(static_cast<char*>(recv.data) + b * send.bytes(), send.data, send.bytes());
    });
  }
  int pending() const { return int(ops_.size()); }

 private:
  struct Op {
    std::uint64_t id;
    std::function<void()> run;
  };
  class Handle final : public ds::CommHandle {
   public:
    Handle(MirrorComm& c, std::uint64_t id) : c_(c), id_(id) {}
    void wait() override {
      while (!c_.ops_.empty() && c_.ops_.front().id <= id_) {
        auto run = std::move(c_.ops_.front().run);
        c_.ops_.pop_front();
        run();
      }
    }
    bool test() override {
      wait();
      return true;
    }

   private:
    MirrorComm& c_;
    std::uint64_t id_;
  };
  ds::CommWork start(std::function<void()> run) {
    ops_.push_back(Op{++next_, std::move(run)});
    return std::make_unique<Handle>(*this, next_);
  }
  [[noreturn]] static void fail() { DS_THROW("mirror: no blocking collective expected"); }
  std::deque<Op> ops_;
  std::uint64_t next_ = 0;
};

// The device store's behaviour towards the fetcher, in host memory with PROT_NONE for unmapped.
class ProtStore final : public ds::engine::Zero3Store {
 public:
  ProtStore(const ds::engine::PartitionMap& map, const ds::engine::StoreOptions& o, LaggingStream& s)
      : Zero3Store(map, 0, o) {
    bytes_ = (map_.padded_numel * 4 + kAlign - 1) / kAlign * kAlign;
    for (void** p : {&flat_params_, &flat_grads_}) {
      *p = mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      DS_CHECK(*p != MAP_FAILED, "mmap");
    }
    mapped_[0].assign(map_.groups.size(), false);
    mapped_[1].assign(map_.groups.size(), false);
    part_params_.assign(map_.partition_numel, 0.f);
    part_grads_.assign(map_.partition_numel, 0.f);
    params_q_ = std::make_unique<DeferredReleases>(s, [this](std::size_t b, std::size_t e) { unmap(flat_params_, b, e); });
    grads_q_ = std::make_unique<DeferredReleases>(s, [this](std::size_t b, std::size_t e) { unmap(flat_grads_, b, e); });
  }
  ~ProtStore() override {
    params_q_.reset();
    grads_q_.reset();
    munmap(flat_params_, bytes_);
    munmap(flat_grads_, bytes_);
  }
  TensorView params(std::size_t off, std::size_t n) const override {
    return TensorView{static_cast<float*>(flat_params_) + off, n, DType::F32};
  }
  TensorView grads(std::size_t off, std::size_t n) const override {
    return TensorView{static_cast<float*>(flat_grads_) + off, n, DType::F32};
  }
  ds::precision::GradStats grad_stats() override { return {}; }
  void optimizer_step(ds::optim::Optimizer&, ds::optim::StepContext) override {}
  void gather_params(ds::Communicator&) override {}
  void zero_grads() override { std::fill(part_grads_.begin(), part_grads_.end(), 0.f); }
  void add_memory(ds::engine::ModelStateBytes&) const override {}

  void set_initial_group(std::size_t g, const float* v) override {
    std::memcpy(part_params_.data() + map_.groups[g].part_offset, v, map_.groups[g].piece * 4);
  }
  void read_part_params(std::size_t g, void* dst) const override {
    std::memcpy(dst, part_params_.data() + map_.groups[g].part_offset, map_.groups[g].piece * 4);
  }
  TensorView part_params(std::size_t g) const override {
    return TensorView{const_cast<float*>(part_params_.data()) + map_.groups[g].part_offset, map_.groups[g].piece,
                      DType::F32};
  }
  void params_needed(std::size_t g) override {
    params_q_->poll();
    grads_q_->poll();
    if (params_q_->cancel(g)) ++cancelled_params;
    const auto [lo, hi] = range(g);
    map(flat_params_, lo, hi);
  }
  void release_params(std::size_t g) override {
    const auto [lo, hi] = range(g);
    params_q_->defer(g, lo, hi);
  }
  void grads_needed(std::size_t g) override {
    const auto [lo, hi] = range(g);
    if (grads_q_->cancel(g)) {
      ++cancelled_grads;
      std::memset(static_cast<char*>(flat_grads_) + lo, 0, hi - lo);
    }
    map(flat_grads_, lo, hi);
  }
  void release_grads(std::size_t g) override {
    const auto [lo, hi] = range(g);
    grads_q_->defer(g, lo, hi);
  }
  void fold(std::size_t g, TensorView reduced) override {
    ds::engine::add_into_f32(part_grads_.data() + map_.groups[g].part_offset, reduced);
  }
  bool orders_on_device() const override { return true; }
  void order_after(ds::CommHandle& w) override {
    ++ordered;
    w.order_stream(nullptr);  // the base: waits (as StagedComm does)
  }
  void* reduce_scratch(std::size_t bytes) override {
    scratch_.assign(bytes / 4 + 1, 0.f);
    return scratch_.data();
  }

  void flush() {
    params_q_->flush();
    grads_q_->flush();
  }
  bool params_mapped(std::size_t g) const { return mapped_[0][g]; }
  bool grads_mapped(std::size_t g) const { return mapped_[1][g]; }
  std::vector<float> part_params_, part_grads_;
  int ordered = 0, cancelled_params = 0, cancelled_grads = 0;

 private:
  std::pair<std::size_t, std::size_t> range(std::size_t g) const {
    const auto& fg = map_.groups[g];
    return {fg.offset * 4, std::min(bytes_, ((fg.offset + fg.padded) * 4 + kAlign - 1) / kAlign * kAlign)};
  }
  std::size_t group_at(std::size_t lo) const {
    for (std::size_t g = 0; g < map_.groups.size(); ++g)
      if (range(g).first == lo) return g;
    DS_THROW("no group starts at byte " << lo);
  }
  void map(void* base, std::size_t lo, std::size_t hi) {
    // Made resident (a no-op where it is already: the device's populate keeps mapped chunks).
    const int k = base == flat_params_ ? 0 : 1;
    if (mapped_[k][group_at(lo)]) return;
    ASSERT_EQ(mprotect(static_cast<char*>(base) + lo, hi - lo, PROT_READ | PROT_WRITE), 0);
    mapped_[k][group_at(lo)] = true;
  }
  void unmap(void* base, std::size_t lo, std::size_t hi) {
    // Released: reads zero when mapped again, faults until then.
    ASSERT_EQ(madvise(static_cast<char*>(base) + lo, hi - lo, MADV_DONTNEED), 0);
    ASSERT_EQ(mprotect(static_cast<char*>(base) + lo, hi - lo, PROT_NONE), 0);
    mapped_[base == flat_params_ ? 0 : 1][group_at(lo)] = false;
  }
  std::size_t bytes_ = 0;
  void* flat_params_ = nullptr;
  void* flat_grads_ = nullptr;
  std::vector<float> scratch_;
  std::vector<bool> mapped_[2];
  std::unique_ptr<DeferredReleases> params_q_, grads_q_;
};

// Four groups over 2 ranks: a small persistent one, two of ~600K elements (several 2 MiB
// ranges each), one of 300K; fp32.
struct Model {
  ds::engine::PartitionMap map;
  Model() {
    std::vector<ds::ParamInfo> params = {{"a0", {300}},     {"a1", {200}},    {"b0", {400000}}, {"b1", {200001}},
                                         {"c0", {600000}},  {"d0", {150000}}, {"d1", {150001}}};
    std::vector<ds::ParamGroup> groups = {{"a", 0, 2}, {"b", 2, 2}, {"c", 4, 1}, {"d", 5, 2}};
    map = ds::engine::make_partition_map(params, 2, 3, groups, 4);
  }
};

float value(std::size_t g, std::size_t i, int version) { return float(g * 1000 + i % 997) + 0.5f * float(version); }

}  // namespace

TEST(Zero3DeviceFetcher, MapsBeforeUseOrdersGathersAndDefersReleases) {
  Model m;
  const auto& map = m.map;
  const std::size_t G = map.groups.size();
  ds::engine::StoreOptions so;
  LaggingStream stream;
  ProtStore store(map, so, stream);
  for (std::size_t g = 0; g < G; ++g) {
    std::vector<float> v(map.groups[g].padded);
    for (std::size_t i = 0; i < map.groups[g].piece; ++i) v[i] = value(g, i, 0);
    store.set_initial_group(g, v.data());
  }
  MirrorComm comm;
  ds::Timers timers;
  ds::engine::FetchOptions fo;
  fo.persistence_threshold = 1000;       // group "a" only
  fo.prefetch_elems = 700000;            // about one big group ahead
  fo.max_reuse = 0;                      // released after each use (no reuse keeping)
  ds::engine::GroupFetcher f(map, store, comm, fo, timers);

  int version = 0;
  auto check_params = [&](std::size_t g) {
    const auto& fg = map.groups[g];
    const float* p = store.params(fg.offset, fg.padded).as<float>();
    std::size_t bad = 0;
    for (std::size_t b = 0; b < 2; ++b)
      for (std::size_t i = 0; i < fg.piece; ++i) bad += p[b * fg.piece + i] != value(g, i, version);
    EXPECT_EQ(bad, 0u) << "group " << g << " read before its gather completed, or stale (version " << version << ")";
  };
  // `lagging`: the device runs one release behind the host; otherwise it runs nothing during
  // the pass (far behind: every release of the pass and of the backward before stays queued).
  auto forward = [&](bool lagging) {
    f.begin_forward();
    for (std::size_t g = 0; g < G; ++g) {
      f.acquire(g, ds::Pass::Forward);
      check_params(g);
      if (lagging) stream.lag_one();
      f.release(g, ds::Pass::Forward);
    }
    f.end_forward();
  };
  // `skip`: a group backward never acquires nor writes (reduced at end_backward).
  auto backward = [&](bool boundary, std::size_t skip) {
    f.begin_backward(boundary);
    for (std::size_t g = G; g-- > 0;) {
      if (g == skip) continue;
      const auto& fg = map.groups[g];
      f.acquire(g, ds::Pass::Backward);
      check_params(g);
      for (std::size_t i = fg.first_param; i < fg.first_param + fg.param_count; ++i) {
        float* gr = store.grads(map.params[i].offset, map.params[i].numel).as<float>();
        for (std::size_t j = 0; j < map.params[i].numel; ++j) gr[j] += 1.0f;  // accumulates: must start at zero
      }
      for (std::size_t i = fg.first_param; i < fg.first_param + fg.param_count; ++i) f.grad_ready(i);
      stream.lag_one();
      f.release(g, ds::Pass::Backward);
    }
    f.end_backward();
  };
  auto check_grads = [&](float want, std::size_t skip) {
    for (std::size_t g = 0; g < G; ++g) {
      const auto& fg = map.groups[g];
      std::size_t bad = 0;
      for (std::size_t j = 0; j < fg.piece; ++j) bad += store.part_grads_[fg.part_offset + j] != (g == skip ? 0.f : want);
      EXPECT_EQ(bad, 0u) << "group " << g << ": the reduced gradients are not " << (g == skip ? 0.f : want);
    }
  };

  // Two micro-steps (the first records the traces), group "c" unused in the first backward.
  forward(true);
  backward(false, 2);
  forward(false);
  backward(true, 2);
  f.finish();
  // Each micro-step: 1 per element from each of the 2 ranks, so 4; "c" got 2 (second only).
  {
    const auto& fc = map.groups[2];
    std::size_t bad = 0;
    for (std::size_t j = 0; j < fc.piece; ++j) bad += store.part_grads_[fc.part_offset + j] != 0.f;
    EXPECT_EQ(bad, 0u) << "the group backward never wrote must reduce to zero";
  }
  check_grads(4.f, 2);
  // A step: new pieces, the gathered (persistent) copies stale, gradients zeroed.
  ++version;
  for (std::size_t g = 0; g < G; ++g)
    for (std::size_t i = 0; i < map.groups[g].piece; ++i) store.part_params_[map.groups[g].part_offset + i] = value(g, i, version);
  f.params_changed();
  store.zero_grads();
  forward(true);  // prefetched along the trace now, ordered instead of waited
  backward(true, G);
  f.finish();
  check_grads(2.f, G);
  EXPECT_EQ(comm.pending(), 0) << "operations left unwaited";
  EXPECT_GT(store.ordered, 0) << "no gather was ordered on the stream: the device branch did not run";
  EXPECT_GT(store.cancelled_params, 0) << "no re-acquire met a queued release";
  EXPECT_GT(store.cancelled_grads, 0) << "no micro-step met the previous one's queued gradient release";
  // Once the stream has run, only the persistent group's parameters stay mapped.
  stream.completed = stream.recorded;
  store.flush();
  for (std::size_t g = 0; g < G; ++g) {
    EXPECT_EQ(store.params_mapped(g), g == 0) << "group " << g << " parameters";
    EXPECT_FALSE(store.grads_mapped(g)) << "group " << g << " gradients still mapped";
  }
}
