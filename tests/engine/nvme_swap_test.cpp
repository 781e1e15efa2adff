// NvmeSwap and the stage-3 store over it (src/engine/src/nvme_swap.h, zero3_store.h), one rank,
// swap files under the temp directory:
//   - a checkpoint load at stage 3 with the master on NVMe maps the swap files once: the
//     working partition is rounded from the same views the load wrote (the counters say one
//     map; the partition read back is the loaded master rounded).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "ds/core/half.h"
#include "ds/engine/partition.h"
#include "ds/optim/optimizer.h"
#include "nvme_swap.h"
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
