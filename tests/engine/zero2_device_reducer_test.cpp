// The GradReducer's device branch of ZeRO-2 on the CPU: the reducer drives a GradPages that
// behaves like DevicePagedBuffer's chunks -- unmapped memory is PROT_NONE, so a write or a
// reduction touching a chunk the reducer did not map first crashes the test, as a kernel
// would fault on the device -- through the calls the engine and the module make (begin /
// end_backward, Backward acquires of each group, grad_ready), with a communicator whose
// reduction reads and writes every element of a bucket (an identity, as one rank's sum).
// Checked over two micro-steps (gas 2), for every rank's slice of 3 ranks, with groups (the
// hooks map a group's not-final gradients) and without (the whole space at the start):
//   - nothing faults: acquires map what backward writes, a bucket's launch maps the rest of
//     it (a parameter of a group backward never acquires, padding) before the reduction
//     reads it (without either map the test crashes: checked);
//   - after each backward exactly the slice's chunks are mapped, the slice holds the sum of
//     the micro-steps' gradients, the other ranks' elements in those chunks are zero;
//   - during backward chunks came and went (the peak stays below the whole buffer).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "chunk_table.h"
#include "ds/core/error.h"
#include "ds/core/timer.h"
#include "ds/engine/partition.h"
#include "grad_pages.h"
#include "grad_reducer.h"
#include "param_store.h"

namespace {

using namespace ds;
using namespace ds::engine;

// Device-like chunks in host memory: PROT_NONE until made resident (then zero), PROT_NONE
// again after release.
class ProtectedChunks final : public GradPages {
 public:
  ProtectedChunks(std::size_t bytes, std::size_t chunk) : table_(bytes, chunk) {
    void* p = mmap(nullptr, table_.reserved_bytes(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    DS_CHECK(p != MAP_FAILED, "mmap failed");
    base_ = static_cast<char*>(p);
  }
  ~ProtectedChunks() override { munmap(base_, table_.reserved_bytes()); }
  char* data() const { return base_; }
  const ChunkTable& table() const { return table_; }

  std::size_t unit() const override { return table_.chunk_bytes(); }
  std::size_t mapped_bytes() const override { return table_.reserved_bytes(); }
  bool on_device() const override { return true; }
  void make_resident(std::size_t begin, std::size_t end) override {
    const std::size_t cb = table_.chunk_bytes();
    for (const auto& run : table_.unmapped_runs(begin, end)) {
      char* at = base_ + run.first * cb;
      const std::size_t n = (run.last - run.first) * cb;
      DS_CHECK(mprotect(at, n, PROT_READ | PROT_WRITE) == 0, "mprotect failed");
      std::memset(at, 0, n);  // as the device buffer's memset after the map
      for (std::size_t c = run.first; c < run.last; ++c) table_.set_mapped(c, true);
    }
  }
  void release(std::size_t begin, std::size_t end) override {
    const std::size_t cb = table_.chunk_bytes();
    for (std::size_t c : table_.mapped_in(begin, end)) {
      std::memset(base_ + c * cb, 0x7f, cb);  // stale contents, should anything map it without zeroing
      DS_CHECK(mprotect(base_ + c * cb, cb, PROT_NONE) == 0, "mprotect failed");
      table_.set_mapped(c, false);
      ++releases;
    }
  }
  void zero(std::size_t begin, std::size_t end) override {
    if (end > begin) std::memset(base_ + begin, 0, end - begin);  // faults if not mapped
  }
  std::size_t resident_bytes(std::size_t begin, std::size_t end) const override {
    return table_.resident_bytes(begin, end);
  }
  using GradPages::resident_bytes;
  int releases = 0;

 private:
  ChunkTable table_;
  char* base_ = nullptr;
};

// A ParamStore with only what the reducer uses: fp32 gradients in ProtectedChunks, the
// slice's chunks mapped for good (as DeviceParamStore at ZeRO-2).
class ChunkStore final : public ParamStore {
 public:
  ChunkStore(const PartitionMap& map, int rank, std::size_t chunk)
      : ParamStore(map, rank, options()), pages_(map.padded_numel * sizeof(float), chunk) {
    const ByteRange keep = units_covering(slice_.offset, slice_.count, sizeof(float), chunk, pages_.mapped_bytes());
    keep_lo_ = keep.begin;
    keep_hi_ = keep.end;
    pages_.make_resident(keep_lo_, keep_hi_);
  }
  TensorView params(std::size_t, std::size_t) const override { return {}; }
  TensorView grads(std::size_t offset, std::size_t count) const override {
    return TensorView{pages_.data() + offset * sizeof(float), count, DType::F32};
  }
  precision::GradStats grad_stats() override { return {}; }
  void optimizer_step(optim::Optimizer&, optim::StepContext) override {}
  void gather_params(Communicator&) override {}
  void zero_grads() override {}
  void add_memory(ModelStateBytes&) const override {}
  GradPages* grad_space() override { return &pages_; }
  ProtectedChunks pages_;

 private:
  static StoreOptions options() {
    StoreOptions o;
    o.release_grads = true;
    return o;
  }
};

// One rank's view of a reduction that reads and writes every element (the sum over one rank).
class TouchingComm final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "touching"; }
  void all_reduce(TensorView b, ReduceOp) override { touch(b); }
  CommWork iall_reduce(TensorView b, ReduceOp) override {
    touch(b);
    return std::make_unique<Done>();
  }
  void reduce_scatter(TensorView, TensorView, ReduceOp) override { DS_THROW("not used"); }
  CommWork ireduce_scatter(TensorView, TensorView, ReduceOp) override { DS_THROW("not used"); }
  void all_gather(TensorView, TensorView) override { DS_THROW("not used"); }
  CommWork iall_gather(TensorView, TensorView) override { DS_THROW("not used"); }
  void broadcast(TensorView, int) override {}
  void barrier() override {}

 private:
  struct Done final : CommHandle {
    void wait() override {}
    bool test() override { return true; }
  };
  static void touch(TensorView b) {
    volatile float* p = static_cast<float*>(b.data);
    for (std::size_t i = 0; i < b.count; ++i) p[i] = p[i] + 0.0f;
  }
};

struct Layout {
  std::vector<ParamInfo> infos;
  std::vector<ParamGroup> groups;
};

// 10 parameters of 1.5k-9.5k elements (about 15 chunks of 16 KiB in fp32); groups: {0} (a tied
// embedding: written first and last), {1-3}, {4}, {5} (unused: backward never acquires it nor
// writes it, it only reports it; it spans whole chunks of its own), {6-9}.
Layout layout() {
  Layout l;
  const std::int64_t sizes[] = {5000, 3000, 7000, 1500, 9000, 9500, 6000, 4000, 8000, 3500};
  for (int i = 0; i < 10; ++i) l.infos.push_back({"p" + std::to_string(i), {sizes[i]}});
  l.groups = {{"embed", 0, 1}, {"a", 1, 3}, {"b", 4, 1}, {"unused", 5, 1}, {"c", 6, 4}};
  return l;
}

constexpr std::size_t kUnused = 5;       // a parameter backward never writes (it still reports)
constexpr std::size_t kUnusedGroup = 3;  // its group, never acquired

float value(std::size_t param, int micro) { return float(param + 1) * float(micro + 1); }

void write(const ChunkStore& st, const PartitionMap& map, std::size_t i, int micro) {
  TensorView g = st.grads(map.params[i].offset, map.params[i].numel);
  float* p = g.as<float>();
  for (std::size_t e = 0; e < g.count; ++e) p[e] += value(i, micro);  // faults if not mapped
}

// One backward as GptCuda runs it: the head writes the tied parameter 0 first, the groups in
// reverse, each parameter reported after its write, parameter 0 written again and reported last.
void backward(GradReducer& red, const ChunkStore& st, const PartitionMap& map, bool hooks, int micro, bool boundary) {
  red.begin_backward(boundary);
  auto use = [&](std::size_t g) {
    if (hooks) red.acquire(g, Pass::Backward);
  };
  auto done = [&](std::size_t g) {
    if (hooks) red.release(g, Pass::Backward);
  };
  use(0);
  write(st, map, 0, micro);
  done(0);
  const auto groups = layout().groups;
  for (std::size_t g = groups.size() - 1; g >= 1; --g) {
    const bool used = g != kUnusedGroup;
    if (used) use(g);
    for (std::size_t i = groups[g].first + groups[g].count; i-- > groups[g].first;) {
      if (used) write(st, map, i, micro);
      red.grad_ready(i);
    }
    if (used) done(g);
  }
  use(0);
  write(st, map, 0, micro);
  red.grad_ready(0);
  done(0);
  red.end_backward();
}

void run(bool hooks) {
  const int W = 3;
  const std::size_t chunk = 4 * std::size_t(sysconf(_SC_PAGESIZE));
  const Layout l = layout();
  const PartitionMap map = make_partition_map(l.infos, W, 2, {}, sizeof(float));
  for (int rank = 0; rank < W; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + (hooks ? ", groups" : ", no groups"));
    ChunkStore st(map, rank, chunk);
    TouchingComm comm;
    Timers timers;
    ReducerOptions ro;
    ro.bucket_size = 6000;
    ro.release_grads = true;
    if (hooks) ro.groups = l.groups;
    GradReducer red(map, st, comm, ro, timers);
    const auto [keep_lo, keep_hi] = st.kept_bytes();
    const RankSlice s = st.slice();
    for (int micro = 0; micro < 2; ++micro) {
      backward(red, st, map, hooks, micro, micro == 1);
      // Only the slice's chunks stay mapped.
      EXPECT_EQ(st.pages_.resident_bytes(), keep_hi - keep_lo) << "after micro-step " << micro;
      EXPECT_EQ(st.pages_.resident_bytes(keep_lo, keep_hi), keep_hi - keep_lo);
      // The slice holds the sum so far; other ranks' elements in its chunks are zero.
      const float* g = reinterpret_cast<const float*>(st.pages_.data());
      for (std::size_t e = keep_lo / sizeof(float); e < keep_hi / sizeof(float) && e < map.padded_numel; ++e) {
        float want = 0;
        if (e >= s.offset && e < s.offset + s.count) {
          for (std::size_t i = 0; i < map.params.size(); ++i)
            if (i != kUnused && e >= map.params[i].offset && e < map.params[i].offset + map.params[i].numel)
              for (int m = 0; m <= micro; ++m) want += value(i, m) * (i == 0 ? 2.0f : 1.0f);
        }
        ASSERT_EQ(g[e], want) << "element " << e << " after micro-step " << micro;
      }
    }
    EXPECT_GT(st.pages_.releases, 0);
    EXPECT_GE(red.peak_resident(), keep_hi - keep_lo);
    std::printf("%s, rank %d: %zu of %zu bytes mapped at most, %zu kept\n", hooks ? "groups" : "no groups", rank,
                red.peak_resident(), st.pages_.mapped_bytes(), keep_hi - keep_lo);
    if (hooks) {
      EXPECT_LT(red.peak_resident(), st.pages_.mapped_bytes()) << "every chunk was mapped at once";
    } else {
      EXPECT_EQ(red.peak_resident(), st.pages_.mapped_bytes());  // the whole space, for a moment
    }
  }
}

TEST(Zero2DeviceReducer, GroupsMapWhatBackwardWritesAndOnlyTheSliceStays) { run(true); }
// No groups: everything is mapped at the start of each backward, released as buckets finish.
TEST(Zero2DeviceReducer, WithoutGroupsTheWholeSpaceIsMappedFirst) { run(false); }

}  // namespace
