// NvmeSwap and the stage-3 store over it (src/engine/src/nvme_swap.h, zero3_store.h), one rank,
// swap files under the temp directory:
//   - a checkpoint load at stage 3 with the master on NVMe maps the swap files once: the
//     working partition is rounded from the same views the load wrote (the counters say one
//     map; the partition read back is the loaded master rounded).
//   - the parameter file written behind (write_params_behind: the step with the master in
//     memory): every read right after it returns the new values, round after round, at
//     unaligned offsets across chunk boundaries; a write that fails behind the call is
//     thrown as the queue words it by the next read of its blocks.
//   - asynchronous reads of the parameter file (the fetcher's gathers): one started right
//     after a write behind sees the new values; one started before a write sees the old ones;
//     map() finishes the open reads into their destinations.
//   - the stage-3 fetcher over it (one rank): a prefetched group's piece is read while the
//     "module" computes and waited when the group is acquired, never read synchronously; after
//     a load wrote the partition behind, the next pass gathers the loaded values.
//   - a failed asynchronous read (the parameter file truncated underneath: pread meets its
//     end): thrown by finish_read_params naming the file and the read, its destination left
//     alone, nothing left open; in the fetcher, by the acquire that needs the piece, with the
//     other prefetches still open finished by the destructor.
//   - the optimizer step's writes behind (offload_optimizer nvme): reads of the parameter
//     file, the next step and map() right after a step see its values (bit for bit the
//     in-memory AdamW); a write that fails behind the step (a descriptor swapped for a
//     read-only one) is thrown by the next step, map() or write_master, naming the file.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ds/core/error.h"
#include "ds/core/half.h"
#include "ds/engine/partition.h"
#include "ds/optim/optimizer.h"
#include "nvme_swap.h"
#include "zero3_fetcher.h"
#include "zero3_store.h"

namespace {

namespace fs = std::filesystem;
using ds::DType;

fs::path swap_root() {
  static const fs::path p = [] {
    fs::path d = fs::temp_directory_path() / "dstrain_nvme_swap_test";
    fs::create_directories(d);
    return d;
  }();
  return p;
}

// Bytes this process caused to be fetched from the storage layer (/proc/self/io read_bytes):
// what a mapped file's page faults cost, which no counter of ours sees. 0 where unreadable.
std::size_t storage_read_bytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  std::size_t v = 0;
  while (f >> key >> v)
    if (key == "read_bytes:") return v;
  return 0;
}

std::unique_ptr<ds::optim::Optimizer> adamw() {
  ds::optim::OptimizerParams oc;
  oc.type = "adamw";
  oc.lr = 1e-3;
  return ds::optim::make_optimizer(oc);
}

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::vector<float> v(n);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : v) x = nd(g);
  return v;
}

// A stage-3 store on one rank: `groups` groups of `per_group` elements (uneven on purpose),
// master and parameters on NVMe, bf16 working parameters.
struct Stage3 {
  ds::engine::PartitionMap map;
  std::unique_ptr<ds::optim::Optimizer> opt = adamw();
  std::unique_ptr<ds::engine::PartitionedParamStore> store;

  Stage3(std::size_t groups, std::size_t per_group, bool optimizer_on_nvme = true) {
    std::vector<ds::ParamInfo> params;
    std::vector<ds::ParamGroup> gs;
    for (std::size_t g = 0; g < groups; ++g) {
      const std::string n = std::to_string(g);
      params.push_back({std::string("p").append(n), {std::int64_t(per_group + g)}});
      gs.push_back({std::string("g").append(n), g, 1});
    }
    map = ds::engine::make_partition_map(params, 1, 3, gs, ds::dtype_size(DType::BF16));
    ds::engine::StoreOptions o;
    o.wdtype = DType::BF16;
    o.nvme.optimizer = optimizer_on_nvme;
    o.nvme.params = true;
    o.nvme.optimizer_path = o.nvme.params_path = swap_root().string();
    o.nvme.optimizer_key = "offload_optimizer.nvme_path";
    o.nvme.params_key = "offload_param.nvme_path";
    o.nvme.sub_group = 1 << 20;
    store = std::make_unique<ds::engine::PartitionedParamStore>(map, 0, o);
    store->attach_optimizer(*opt);
  }
  const ds::engine::NvmeSwap& swap() const { return *store->nvme(); }
  // The flat space's values for the dense values v (gaps between groups zero).
  std::vector<float> flat(const std::vector<float>& dense) const {
    std::vector<float> f(map.padded_numel, 0.f);
    for (const auto& p : map.params) std::copy_n(dense.begin() + std::ptrdiff_t(p.dense_offset), p.numel, f.begin() + std::ptrdiff_t(p.offset));
    return f;
  }
  // Every group's working piece, read from the parameter file, in fp32.
  std::vector<float> partition() const {
    std::vector<float> out(map.partition_numel);
    std::vector<std::uint16_t> w(map.largest_group());
    for (std::size_t g = 0; g < map.groups.size(); ++g) {
      const auto& fg = map.groups[g];
      store->read_part_params(g, w.data());
      ds::convert(w.data(), DType::BF16, out.data() + fg.part_offset, DType::F32, fg.piece);
    }
    return out;
  }
};

// A swap with only the parameter file (offload_param nvme, the master in memory): n bf16
// elements.
std::unique_ptr<ds::engine::NvmeSwap> param_swap(std::size_t n, const ds::io::AioOptions& aio = {}) {
  static const auto opt = adamw();
  ds::engine::NvmeOptions o;
  o.params = true;
  o.params_path = swap_root().string();
  o.params_key = "offload_param.nvme_path";
  o.aio = aio;
  return std::make_unique<ds::engine::NvmeSwap>(o, 0, n, *opt, DType::BF16);
}

// The descriptor this process holds open on a file named `name` under the swap root (-1: none).
int open_swap_fd(const std::string& name) {
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const fs::path target = fs::read_symlink(e.path(), ec);
    if (!ec && target.filename() == name && target.string().rfind(swap_root().string(), 0) == 0)
      return std::stoi(e.path().filename().string());
  }
  return -1;
}

// The path of the swap file `name` this process holds open (empty: none).
std::string swap_path(const std::string& name) {
  const int fd = open_swap_fd(name);
  return fd < 0 ? std::string() : fs::read_symlink("/proc/self/fd/" + std::to_string(fd)).string();
}

// Round r's master: every element differs from the last round's, also in bf16 (8 bits).
std::vector<float> round_values(std::size_t n, int r) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = float(int(i % 127) + 1) * (r % 2 ? 1.f : -1.f) * float(1 << (r % 8));
  return v;
}

std::vector<float> read_back(ds::engine::NvmeSwap& s, std::size_t offset, std::size_t count) {
  std::vector<std::uint16_t> w(count);
  std::vector<float> out(count);
  s.read_params(offset, count, w.data());
  ds::convert(w.data(), DType::BF16, out.data(), DType::F32, count);
  return out;
}

// One rank: the fetcher calls no collective then (a call would be a bug: it throws).
class OneRank final : public ds::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend() const override { return "one-rank"; }
  void all_reduce(ds::TensorView, ds::ReduceOp) override { fail(); }
  ds::CommWork iall_reduce(ds::TensorView, ds::ReduceOp) override { fail(); }
  void reduce_scatter(ds::TensorView, ds::TensorView, ds::ReduceOp) override { fail(); }
  ds::CommWork ireduce_scatter(ds::TensorView, ds::TensorView, ds::ReduceOp) override { fail(); }
  void all_gather(ds::TensorView, ds::TensorView) override { fail(); }
  ds::CommWork iall_gather(ds::TensorView, ds::TensorView) override { fail(); }
  void broadcast(ds::TensorView, int) override { fail(); }
  void barrier() override {}

 private:
  [[noreturn]] static void fail() { DS_THROW("one rank: no collective expected"); }
};

// The master rounded to bf16 and back, element by element.
std::vector<float> rounded(const float* master, std::size_t n) {
  std::vector<std::uint16_t> w(n);
  std::vector<float> out(n);
  ds::convert(master, DType::F32, w.data(), DType::BF16, n);
  ds::convert(w.data(), DType::BF16, out.data(), DType::F32, n);
  return out;
}

}  // namespace

TEST(NvmeSwap, Stage3LoadMapsTheMasterOnceAndRoundsThePartitionFromIt) {
  // 3 groups of ~2 Mi elements: a 24 MiB master file (+ two Adam moments).
  Stage3 s(3, std::size_t(2) << 20);
  const std::size_t P = s.map.partition_numel;
  s.store->set_initial(s.flat(random_values(s.map.total_numel, 1)).data());
  const auto before = s.swap().counters();
  const std::size_t read0 = storage_read_bytes();
  // What Engine::load_checkpoint does: the views, the loaded master through them, the views
  // ended as written, from_host.
  const ds::engine::StateViews v = s.store->state_views(*s.opt);
  ASSERT_EQ(v.master.size(), P);
  const std::vector<float> loaded = random_values(P, 2);
  std::copy(loaded.begin(), loaded.end(), v.master.begin());
  s.store->done_with_state_views(true);
  s.store->from_host(*s.opt, true);
  const std::size_t read = storage_read_bytes() - read0;
  const auto after = s.swap().counters();
  EXPECT_EQ(after.maps - before.maps, 1u) << "the load maps the swap files once";
  const std::size_t files = 1 + s.opt->state_names().size();
  EXPECT_EQ(after.mapped_bytes - before.mapped_bytes, files * ((P + 4095) / 4096 * 4096) * sizeof(float));
  std::printf("[ measure  ] load of a %zu-element partition: %zu map(s), %.1f MiB read from storage "
              "(master file %.1f MiB)\n",
              P, after.maps - before.maps, double(read) / (1 << 20), double(P * sizeof(float)) / (1 << 20));
  // The working partition is the loaded master rounded (its padding elements included: zero).
  const std::vector<float> want = rounded(loaded.data(), P);
  const std::vector<float> got = s.partition();
  std::size_t diff = 0;
  for (const auto& g : s.map.groups)
    for (std::size_t i = 0; i < g.piece_real(0); ++i) diff += got[g.part_offset + i] != want[g.part_offset + i];
  EXPECT_EQ(diff, 0u) << "working parameters that do not follow the loaded master";
}

TEST(NvmeSwap, ParametersWrittenBehindAreWhatTheNextReadsSee) {
  // Four chunks of the ring (4 Mi elements each, the last one short): the call returns with
  // the last two being written, and the reads that follow at once must wait for them.
  constexpr std::size_t kChunk = std::size_t(1) << 22;
  const std::size_t n = 3 * kChunk + 12345;
  auto swap = param_swap(n);
  // Ranges read straight after each call: the short last chunk, and unaligned ones across the
  // boundaries of the chunks still in flight.
  const std::vector<std::pair<std::size_t, std::size_t>> ranges{
      {n - 20000, 20000}, {3 * kChunk - 777, 1555}, {2 * kChunk - 3, 4099}, {1, 4095}};
  for (int r = 1; r <= 4; ++r) {
    const std::vector<float> master = round_values(n, r);
    const auto before = swap->counters();
    swap->write_params_behind(master.data());
    for (const auto& [off, cnt] : ranges) {
      const std::vector<float> got = read_back(*swap, off, cnt);
      std::size_t diff = 0;
      for (std::size_t i = 0; i < cnt; ++i) diff += got[i] != master[off + i];
      ASSERT_EQ(diff, 0u) << "round " << r << ": read at " << off << " saw older values";
    }
    const auto after = swap->counters();
    EXPECT_EQ(after.param_writes_behind - before.param_writes_behind, 4u);
    EXPECT_EQ(after.param_sync_writes, 0u);
    EXPECT_GE(after.param_writes_waited - before.param_writes_waited, 2u) << "the reads found the last chunks in flight";
  }
  EXPECT_EQ(read_back(*swap, 0, n), round_values(n, 4));

  // What write-behind saves the step: the same bytes written synchronously (write_params, a
  // chunk at a time, as before) against the call that returns with the last chunks in flight.
  const std::vector<float> master = round_values(n, 5);
  std::vector<std::uint16_t> w(kChunk);
  auto t0 = std::chrono::steady_clock::now();
  for (std::size_t a = 0; a < n; a += kChunk) {
    const std::size_t k = std::min(kChunk, n - a);
    ds::convert(master.data() + a, DType::F32, w.data(), DType::BF16, k);
    swap->write_params(a, k, w.data());
  }
  const double sync_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<float> next = round_values(n, 6);
  t0 = std::chrono::steady_clock::now();
  swap->write_params_behind(next.data());
  const double behind_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[ measure  ] %zu bf16 parameters to params.swap: %.1f ms written synchronously, %.1f ms until "
              "write_params_behind returns\n",
              n, sync_s * 1e3, behind_s * 1e3);
}

TEST(NvmeSwap, AWriteBehindThatFailsIsThrownByTheNextReadOfItsBlocks) {
  constexpr std::size_t kChunk = std::size_t(1) << 22;
  const std::size_t n = kChunk + 5000;  // two chunks: both still queued when the call returns
  auto swap = param_swap(n);
  // Every write to the parameter file fails from here on: its descriptor now reads only.
  const int fd = open_swap_fd("params.swap");
  ASSERT_GE(fd, 0);
  std::string path = fs::read_symlink("/proc/self/fd/" + std::to_string(fd)).string();
  const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(ro, 0);
  ASSERT_EQ(::dup2(ro, fd), fd);
  ::close(ro);
  swap->write_params_behind(round_values(n, 1).data());  // queued: nothing has failed yet
  try {
    read_back(*swap, kChunk + 10, 100);
    FAIL() << "a read after a failed write behind succeeded";
  } catch (const ds::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("params.swap: write of"), std::string::npos) << m;
    EXPECT_NE(m.find(std::strerror(EBADF)), std::string::npos) << m;
  }
}

TEST(NvmeSwap, AsyncReadsSeeTheWritesBeforeThemAndNotTheOnesAfter) {
  constexpr std::size_t kChunk = std::size_t(1) << 22;
  const std::size_t n = 3 * kChunk + 12345;
  auto swap = param_swap(n);
  // Pieces as the fetcher reads them: unaligned, some across the chunks still in flight.
  const std::vector<std::pair<std::size_t, std::size_t>> pieces{
      {n - 20000, 20000}, {3 * kChunk - 777, 1555}, {2 * kChunk - 3, 4099}, {kChunk + 11, 300000}, {1, 4095}};
  auto to_f32 = [](const std::vector<std::uint16_t>& w) {
    std::vector<float> f(w.size());
    ds::convert(w.data(), DType::BF16, f.data(), DType::F32, w.size());
    return f;
  };
  auto same = [](const std::vector<float>& got, const std::vector<float>& want, std::size_t off) {
    std::size_t diff = 0;
    for (std::size_t i = 0; i < got.size(); ++i) diff += got[i] != want[off + i];
    return diff;
  };
  std::vector<float> prev = round_values(n, 0);
  swap->write_params_behind(prev.data());
  for (int r = 1; r <= 4; ++r) {
    const std::vector<float> next = round_values(n, r);
    // Started before the write: the values of the round before.
    std::vector<std::vector<std::uint16_t>> early(pieces.size());
    std::vector<std::uint64_t> early_ids;
    for (std::size_t p = 0; p < pieces.size(); ++p) {
      early[p].resize(pieces[p].second);
      early_ids.push_back(swap->start_read_params(pieces[p].first, pieces[p].second, early[p].data()));
    }
    const auto before = swap->counters();
    swap->write_params_behind(next.data());
    // The write finished those reads before it touched their blocks: their pieces are in
    // already (the queue alone would seldom let a write overtake an older read: this is what
    // says the swap does not count on it).
    for (std::size_t p = 0; p < pieces.size(); ++p)
      EXPECT_EQ(same(to_f32(early[p]), prev, pieces[p].first), 0u) << "round " << r << ": the write left the read at "
                                                                   << pieces[p].first << " open";
    // Started after it: the new values.
    std::vector<std::vector<std::uint16_t>> late(pieces.size());
    std::vector<std::uint64_t> late_ids;
    for (std::size_t p = 0; p < pieces.size(); ++p) {
      late[p].resize(pieces[p].second);
      late_ids.push_back(swap->start_read_params(pieces[p].first, pieces[p].second, late[p].data()));
    }
    for (std::size_t p = 0; p < pieces.size(); ++p) {
      swap->finish_read_params(early_ids[p]);  // finished by the write already: returns at once
      swap->finish_read_params(late_ids[p]);
      EXPECT_EQ(same(to_f32(early[p]), prev, pieces[p].first), 0u) << "round " << r << ": a read started before the "
                                                                   "write saw its values at " << pieces[p].first;
      ASSERT_EQ(same(to_f32(late[p]), next, pieces[p].first), 0u) << "round " << r << ": a read started after the "
                                                                   "write saw older values at " << pieces[p].first;
    }
    const auto after = swap->counters();
    EXPECT_EQ(after.param_async_reads - before.param_async_reads, pieces.size());
    EXPECT_EQ(after.param_sync_reads, before.param_sync_reads);
    prev = next;
  }
}

TEST(NvmeSwap, MapFinishesTheOpenReadsIntoTheirDestinations) {
  Stage3 s(2, 100000);
  s.store->set_initial(s.flat(random_values(s.map.total_numel, 3)).data());
  const auto& g = s.map.groups[1];
  std::vector<std::uint16_t> piece(g.piece), direct(g.piece);
  s.store->read_part_params(1, direct.data());
  const std::uint64_t id = s.store->start_read_part_params(1, piece.data());
  s.store->state_views(*s.opt);  // a checkpoint save while a prefetch is open
  s.store->done_with_state_views(false);
  EXPECT_EQ(piece, direct) << "map() left a read open";
  s.store->finish_read_part_params(id);  // done already: returns at once
  EXPECT_EQ(piece, direct);
}

TEST(NvmeSwap, FetcherReadsPrefetchedPiecesBehindTheComputeAndGathersLoadedValues) {
  // 8 groups of 1 Mi elements (2 MiB of bf16 each), the parameters on NVMe, the master in
  // memory; prefetch 3 groups ahead; each group "computes" for 4 ms between acquire and release.
  constexpr std::size_t kGroups = 8, kPer = std::size_t(1) << 20;
  Stage3 s(kGroups, kPer, /*optimizer_on_nvme=*/false);
  const std::vector<float> first = random_values(s.map.total_numel, 5);
  s.store->set_initial(s.flat(first).data());
  OneRank comm;
  ds::Timers timers;
  ds::engine::FetchOptions fo;
  fo.prefetch_elems = 3 * (kPer + kGroups);
  fo.persistence_threshold = 0;
  ds::engine::GroupFetcher f(s.map, *s.store, comm, fo, timers);
  double acquire_ms = 0;  // the module's time inside acquire: what the reads cost it
  auto pass = [&](const std::vector<float>& partition, double compute_ms) {
    f.begin_forward();
    for (std::size_t g = 0; g < kGroups; ++g) {
      const auto a0 = std::chrono::steady_clock::now();
      f.acquire(g, ds::Pass::Forward);
      acquire_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a0).count();
      const auto& fg = s.map.groups[g];
      std::vector<float> got(fg.numel);
      ds::convert(s.store->params(fg.offset, fg.numel).data, DType::BF16, got.data(), DType::F32, fg.numel);
      const std::vector<float> want = rounded(partition.data() + fg.part_offset, fg.numel);
      EXPECT_EQ(got, want) << "group " << g << " gathered other values";
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() < compute_ms) {
      }
      f.release(g, ds::Pass::Forward);
    }
    f.end_forward();
  };
  // The partition of the dense values: at one rank, the flat space without its gaps.
  auto partition_of = [&](const std::vector<float>& dense) {
    std::vector<float> p(s.map.partition_numel, 0.f);
    for (const auto& fg : s.map.groups) std::copy_n(dense.begin() + std::ptrdiff_t(fg.dense_offset), fg.numel, p.begin() + std::ptrdiff_t(fg.part_offset));
    return p;
  };
  pass(partition_of(first), 0);  // records the trace
  // A load: the master through the views, the partition written behind, the gathered copies
  // stale; the next pass's first acquire and its prefetches read at once after those writes.
  const std::vector<float> loaded = random_values(s.map.partition_numel, 6);
  const ds::engine::StateViews v = s.store->state_views(*s.opt);
  std::copy(loaded.begin(), loaded.end(), v.master.begin());
  s.store->done_with_state_views(true);
  f.params_changed();
  const auto before = s.swap().counters();
  acquire_ms = 0;
  pass(loaded, 4);
  const auto after = s.swap().counters();
  std::printf("[ measure  ] a pass over %zu groups of 2 MiB on NVMe, 4 ms of compute each: %.1f ms inside acquire, "
              "%zu synchronous / %zu asynchronous reads\n",
              kGroups, acquire_ms, after.param_sync_reads - before.param_sync_reads,
              after.param_async_reads - before.param_async_reads);
  EXPECT_EQ(after.param_sync_reads - before.param_sync_reads, 0u) << "the fetcher read a piece synchronously";
  EXPECT_EQ(after.param_async_reads - before.param_async_reads, kGroups);
}

TEST(NvmeSwap, AFailedAsyncReadIsThrownWhereItIsFinishedNamingTheFile) {
  const std::size_t n = (std::size_t(1) << 20) + 5000;  // ~2 MiB of bf16
  auto swap = param_swap(n);
  const std::vector<float> values = round_values(n, 1);
  swap->write_params_behind(values.data());
  ASSERT_EQ(read_back(*swap, 0, 1000), std::vector<float>(values.begin(), values.begin() + 1000));  // on disk
  // The file cut underneath to its first MiB (a real failure: pread meets the end of the file).
  const std::size_t cut = std::size_t(1) << 20, es = 2;
  const std::string path = swap_path("params.swap");
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(::truncate(path.c_str(), off_t(cut)), 0) << std::strerror(errno);
  // Started in this order: a piece inside the cut, one past it, one across it, one inside.
  const std::vector<std::pair<std::size_t, std::size_t>> pieces{
      {100, 3000}, {cut / es + 777, 3000}, {cut / es - 1000, 2000}, {5000, 70000}};
  const std::vector<bool> fails{false, true, true, false};
  constexpr std::uint16_t kUntouched = 0xABCD;
  std::vector<std::vector<std::uint16_t>> dst;
  std::vector<std::uint64_t> ids;
  for (const auto& [off, cnt] : pieces) {
    dst.emplace_back(cnt, kUntouched);
    ids.push_back(swap->start_read_params(off, cnt, dst.back().data()));
  }
  EXPECT_EQ(swap->open_param_reads(), pieces.size());
  for (std::size_t p = 0; p < pieces.size(); ++p) {
    const auto [off, cnt] = pieces[p];
    if (!fails[p]) {
      swap->finish_read_params(ids[p]);
      std::vector<float> got(cnt);
      ds::convert(dst[p].data(), DType::BF16, got.data(), DType::F32, cnt);
      EXPECT_EQ(got, std::vector<float>(values.begin() + std::ptrdiff_t(off), values.begin() + std::ptrdiff_t(off + cnt)))
          << "the read at " << off << " inside the cut";
      continue;
    }
    try {
      swap->finish_read_params(ids[p]);
      ADD_FAILURE() << "the read at " << off << " past the end of the cut file finished without an error";
    } catch (const ds::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path + ": read of"), std::string::npos) << m;
      EXPECT_NE(m.find("the file ends before it"), std::string::npos) << m;
    }
    // Not a silent zero: the destination holds what it held.
    EXPECT_EQ(dst[p], std::vector<std::uint16_t>(cnt, kUntouched)) << "the failed read at " << off << " wrote its destination";
    swap->finish_read_params(ids[p]);  // thrown once: finished now
  }
  EXPECT_EQ(swap->open_param_reads(), 0u) << "a read left open";
  // The swap goes on: the file back to its size (the cut part reads zero), a read past the old
  // cut started and finished, a synchronous one, a write behind read back.
  ASSERT_EQ(::truncate(path.c_str(), off_t(ds::io::align_up(n * es))), 0) << std::strerror(errno);
  std::vector<std::uint16_t> again(3000, kUntouched);
  swap->finish_read_params(swap->start_read_params(cut / es + 777, 3000, again.data()));
  EXPECT_EQ(again, std::vector<std::uint16_t>(3000, 0));
  const std::vector<float> next = round_values(n, 2);
  swap->write_params_behind(next.data());
  EXPECT_EQ(read_back(*swap, 0, n), next);
}

TEST(NvmeSwap, AFailedPrefetchReadIsThrownByTheAcquireThatNeedsIt) {
  // 6 groups of 1 Mi elements, the parameters on NVMe; prefetch 2 groups ahead.
  constexpr std::size_t kGroups = 6, kPer = std::size_t(1) << 20;
  Stage3 s(kGroups, kPer, /*optimizer_on_nvme=*/false);
  s.store->set_initial(s.flat(random_values(s.map.total_numel, 7)).data());
  OneRank comm;
  ds::Timers timers;
  ds::engine::FetchOptions fo;
  fo.prefetch_elems = 2 * (kPer + kGroups);
  fo.persistence_threshold = 0;
  auto f = std::make_unique<ds::engine::GroupFetcher>(s.map, *s.store, comm, fo, timers);
  auto use = [&](std::size_t g) {
    f->acquire(g, ds::Pass::Forward);
    f->release(g, ds::Pass::Forward);
  };
  f->begin_forward();
  for (std::size_t g = 0; g < kGroups; ++g) use(g);  // records the trace
  f->end_forward();
  // The parameter file cut after group 1's blocks: groups 0 and 1 read, 2.. run into its end.
  const auto& g1 = s.map.groups[1];
  const auto& g2 = s.map.groups[2];
  const std::size_t cut = ds::io::align_up((g1.part_offset + g1.piece) * 2);
  ASSERT_GT(ds::io::align_up((g2.part_offset + g2.piece) * 2), cut);
  const std::string path = swap_path("params.swap");
  ASSERT_FALSE(path.empty());
  ASSERT_EQ(::truncate(path.c_str(), off_t(cut)), 0) << std::strerror(errno);
  f->begin_forward();
  use(0);
  use(1);  // its acquire started the reads of groups 2 and 3 (prefetch), which fail
  ASSERT_EQ(s.swap().open_param_reads(), 2u);
  const int waits_before = timers.count("gather_wait");
  try {
    f->acquire(2, ds::Pass::Forward);
    FAIL() << "the acquire of a group whose read failed returned";
  } catch (const ds::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(path + ": read of"), std::string::npos) << m;
    EXPECT_NE(m.find("the file ends before it"), std::string::npos) << m;
  }
  EXPECT_EQ(s.swap().open_param_reads(), 1u) << "group 3's prefetch stays open (the fetcher's destructor finishes it)";
  // The failed acquire left nothing behind: no reference (a nested acquire would otherwise
  // return at once without the group) and no running timer.
  EXPECT_EQ(timers.count("gather_wait"), waits_before + 1) << "the failed acquire's wait timer was not stopped";
  EXPECT_THROW(f->acquire(2, ds::Pass::Forward), ds::Error) << "a second acquire of the failed group returned";
  f.reset();
  EXPECT_EQ(s.swap().open_param_reads(), 0u) << "the fetcher's destructor left a read open";
  // The store goes on (no failure thrown twice): group 0 reads as before.
  std::vector<std::uint16_t> w(s.map.groups[0].piece);
  s.store->read_part_params(0, w.data());
}

namespace {

// An NvmeSwap with the master and AdamW's moments on NVMe (and, with params, the bf16
// parameters): n elements in sub-groups of `sub`, `buffers` buffer sets.
std::unique_ptr<ds::engine::NvmeSwap> optimizer_swap(std::size_t n, std::size_t sub, int buffers, bool params,
                                                     const ds::optim::Optimizer& opt) {
  ds::engine::NvmeOptions o;
  o.optimizer = true;
  o.params = params;
  o.optimizer_path = o.params_path = swap_root().string();
  o.optimizer_key = "offload_optimizer.nvme_path";
  o.params_key = "offload_param.nvme_path";
  o.sub_group = sub;
  o.buffer_count = buffers;
  return std::make_unique<ds::engine::NvmeSwap>(o, 0, n, opt, DType::BF16);
}

ds::optim::StepContext step_ctx(int s) {
  ds::optim::StepContext c;
  c.lr = 1e-3;
  c.step = s;
  return c;
}

}  // namespace

TEST(NvmeSwap, AStepsWritesBehindAreWhatTheNextReadsSee) {
  // 4 sub-groups (the last one short) through 2 buffer sets: the step returns with the last
  // sub-groups' writes in flight -- the master, the moments and the bf16 parameters.
  constexpr std::size_t kSub = std::size_t(1) << 20;
  const std::size_t n = 4 * kSub - 1000;
  auto opt = adamw(), ref = adamw();
  auto swap = optimizer_swap(n, kSub, 2, /*params=*/true, *opt);
  ref->init_state(n);
  std::vector<float> master = random_values(n, 11);
  const std::vector<float> grads = random_values(n, 12);
  swap->write_master(0, n, master.data());
  std::vector<std::uint16_t> ref_working(n);
  // Pieces of the last sub-groups (whose writes are the last queued), unaligned.
  const std::vector<std::pair<std::size_t, std::size_t>> pieces{{n - 5000, 5000}, {3 * kSub - 333, 700}, {2 * kSub + 5, 4000}};
  for (int step = 1; step <= 4; ++step) {
    const auto before = swap->counters();
    swap->step(*opt, ds::TensorView{const_cast<float*>(grads.data()), n, DType::F32}, ds::TensorView{}, step_ctx(step));
    ref->step(master, ds::TensorView{const_cast<float*>(grads.data()), n, DType::F32},
              ds::TensorView{ref_working.data(), n, DType::BF16}, {}, step_ctx(step));
    EXPECT_GT(swap->counters().step_writes_behind - before.step_writes_behind, 0u) << "the step waited for all its writes";
    // At once: reads of the parameter file, synchronous (odd steps) or started (even ones).
    for (const auto& [off, cnt] : pieces) {
      std::vector<std::uint16_t> got(cnt);
      if (step % 2) swap->read_params(off, cnt, got.data());
      else swap->finish_read_params(swap->start_read_params(off, cnt, got.data()));
      ASSERT_EQ(got, std::vector<std::uint16_t>(ref_working.begin() + std::ptrdiff_t(off), ref_working.begin() + std::ptrdiff_t(off + cnt)))
          << "step " << step << ": the read at " << off << " saw older parameters";
    }
  }
  // The next steps read what the steps before wrote (the values above are bit for bit the
  // in-memory AdamW after 4 steps), and so does a checkpoint's map() right after a step.
  const ds::engine::StateViews v = swap->map();
  EXPECT_EQ(std::memcmp(v.master.data(), master.data(), n * sizeof(float)), 0) << "master";
  const auto st = ref->state_tensors();
  ASSERT_EQ(v.state.size(), st.size());
  for (std::size_t t = 0; t < st.size(); ++t)
    EXPECT_EQ(std::memcmp(v.state[t].second.data(), st[t].second.data(), n * sizeof(float)), 0) << v.state[t].first;
  swap->unmap(false);
}

TEST(NvmeSwap, AStepWriteThatFailsBehindIsThrownByTheNextWaitNamingTheFile) {
  // 2 sub-groups through 2 buffer sets: the step waits for none of its own writes.
  constexpr std::size_t kSub = std::size_t(1) << 20;
  const std::size_t n = 2 * kSub - 100;
  const std::vector<float> grads = random_values(n, 13);
  std::vector<std::uint16_t> working(n);
  // What waits next after the failed step: the next step, a checkpoint's map(), a load's
  // write_master.
  for (int next = 0; next < 3; ++next) {
    auto opt = adamw();
    auto swap = optimizer_swap(n, kSub, 2, /*params=*/false, *opt);
    const std::vector<float> master = random_values(n, 14);
    swap->write_master(0, n, master.data());
    auto step = [&](int s) {
      swap->step(*opt, ds::TensorView{const_cast<float*>(grads.data()), n, DType::F32},
                 ds::TensorView{working.data(), n, DType::BF16}, step_ctx(s));
    };
    step(1);
    swap->map();  // its writes on disk (they are behind: the descriptor swap below would fail them)
    swap->unmap(false);
    // Every write to the first moment's file fails from here on: its descriptor now reads only
    // (the step's reads of it still work).
    const std::string name = opt->state_names()[0] + ".swap";
    const int fd = open_swap_fd(name);
    ASSERT_GE(fd, 0);
    const std::string path = swap_path(name);
    const int ro = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(ro, 0);
    ASSERT_EQ(::dup2(ro, fd), fd);
    ::close(ro);
    step(2);  // returns: its writes are behind
    try {
      if (next == 0) step(3);
      else if (next == 1) swap->map();
      else swap->write_master(0, n, master.data());
      ADD_FAILURE() << "case " << next << ": the wait after a failed write behind succeeded";
    } catch (const ds::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(path + ": write of"), std::string::npos) << m;
      EXPECT_NE(m.find(std::strerror(EBADF)), std::string::npos) << m;
    }
  }  // and the swap goes away with nothing in flight
}
