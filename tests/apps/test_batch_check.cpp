// The train app's micro-batch checks: the warning for a micro-batch larger than the data, the
// working-set estimate, the memory limit it is held against (MemAvailable, cgroups v1 and v2,
// read from a tree of our own) and the error that names the key and the figures.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "batch_check.h"
#include "ds/nn/gpt.h"
#include "host_memory.h"
#include "temp_dir.h"

namespace {

using namespace ds::train;
namespace fs = std::filesystem;

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text;
}

BatchPlan plan_of(std::int64_t micro_batch, std::size_t samples, int world) {
  BatchPlan p;
  p.micro_batch = micro_batch;
  p.seq = 16;
  p.train_samples = samples;
  p.world_size = world;
  p.ranks_here = world;
  p.data_name = "data.txt";
  return p;
}

// Every micro-step took the whole of a rank's share without a word when the micro-batch was
// larger than it (the sampler without drop_last).
TEST(BatchCheck, MicroBatchLargerThanTheDataWarns) {
  EXPECT_EQ(micro_batch_repeat_warning(plan_of(50, 100, 2)), "");
  EXPECT_EQ(micro_batch_repeat_warning(plan_of(50, 99, 2)), "");  // ceil(99 / 2) = 50
  const std::string w = micro_batch_repeat_warning(plan_of(64, 100, 2));
  EXPECT_HAS(w, "train_micro_batch_size_per_gpu 64 is more than the 50 training windows each rank gets "
                "(data.txt gives 100 windows of block_size+1 = 17 tokens for 2 rank(s))");
  EXPECT_HAS(w, "each micro-step is a whole epoch and sees the same data again");
  EXPECT_HAS(w, "lower train_micro_batch_size_per_gpu to at most 50");
  EXPECT_EQ(plan_of(64, 100, 2).sequences_per_micro_batch(), 50);
}

// The memory available_host_memory(root) finds: `bytes`, from a source naming `source_part`.
void expect_memory(const std::string& root, std::uint64_t bytes, const std::string& source_part) {
  const auto m = available_host_memory(root);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->bytes, bytes);
  EXPECT_HAS(m->source, source_part);
}

TEST(HostMemory, MemAvailableOrTheLowestCgroupLimit) {
  TempDir d("ds_host_memory");
  const std::string root = d.path.string();
  EXPECT_FALSE(available_host_memory(root));  // nothing readable
  write(d.path / "proc/meminfo", "MemTotal:  4000 kB\nMemAvailable:    3000 kB\n");
  expect_memory(root, 3000u * 1024, "MemAvailable in /proc/meminfo");

  // cgroup v2: the leaf has no limit, its parent's is lower than MemAvailable.
  write(d.path / "proc/self/cgroup", "0::/user.slice/job\n");
  write(d.path / "sys/fs/cgroup/user.slice/job/memory.max", "max\n");
  write(d.path / "sys/fs/cgroup/user.slice/memory.max", "1048576\n");
  expect_memory(root, 1048576u, "the memory cgroup's limit in " + root + "/sys/fs/cgroup/user.slice/memory.max");
  write(d.path / "sys/fs/cgroup/user.slice/memory.max", "999999999999\n");  // above MemAvailable
  expect_memory(root, 3000u * 1024, "MemAvailable in /proc/meminfo");

  // cgroup v1 (the memory controller's own line wins over the v2 one): "no limit" is a number
  // near 2^63.
  write(d.path / "proc/self/cgroup", "7:cpu,cpuacct:/slurm\n4:memory:/slurm/job1\n0::/\n");
  write(d.path / "sys/fs/cgroup/memory/slurm/job1/memory.limit_in_bytes", "9223372036854771712\n");
  write(d.path / "sys/fs/cgroup/memory/slurm/memory.limit_in_bytes", "2000000\n");
  expect_memory(root, 2000000u, "/sys/fs/cgroup/memory/slurm/memory.limit_in_bytes");
}

TEST(BatchCheck, WorkingSetCountsActivationsBuffersAndStates) {
  const ds::nn::Gpt gpt({.n_layer = 2, .n_head = 2, .n_embd = 32, .block_size = 16, .vocab_size = 64});
  std::size_t params = 0;
  for (const auto& p : gpt.parameters()) params += p.numel();
  ds::config::DsConfig cfg;
  BatchPlan plan = plan_of(1000, 100, 2);  // 50 sequences per micro-batch really
  WorkingSet w = estimate_working_set(cfg, gpt, plan);
  EXPECT_EQ(w.activations, double(gpt.activation_bytes(50, 16)));
  EXPECT_EQ(w.batch_buffers, 1000.0 * 16 * 2 * 4);  // the loader's buffers hold the full micro-batch
  EXPECT_EQ(w.states.params, params * 4);        // fp32, stage 0, Adam: 4 + 4 + 4 + 8 bytes
  EXPECT_EQ(w.states.grads, params * 4);
  EXPECT_EQ(w.states.master, params * 4);
  EXPECT_EQ(w.states.optimizer_state, params * 8);
  EXPECT_EQ(w.total(), w.activations + w.batch_buffers + double(params * 20));

  cfg.zero_optimization.stage = 3;
  cfg.zero_optimization.offload_optimizer.device = "nvme";
  cfg.zero_optimization.offload_param.device = "nvme";
  w = estimate_working_set(cfg, gpt, plan);  // on disk: the master, optimizer state and params
  EXPECT_EQ(w.states.params + w.states.master + w.states.optimizer_state, 0u);
  EXPECT_EQ(w.states.grads, params * 4 / 2);
  plan.on_gpu = true;
  w = estimate_working_set(cfg, gpt, plan);
  EXPECT_EQ(w.activations, 0);
  EXPECT_EQ(w.states.total(), 0u);
}

TEST(BatchCheck, AWorkingSetAboveTheMemoryNamesTheKeyAndFigures) {
  WorkingSet w;
  w.activations = 3.0 * (1ull << 30);
  w.batch_buffers = 1.0 * (1ull << 30);
  const BatchPlan plan = plan_of(100000000, 1000000, 2);
  check_working_set(w, plan, HostMemory{9ull << 30, "MemAvailable in /proc/meminfo"});  // 8 GiB fits
  const std::string e = error_of([&] { check_working_set(w, plan, HostMemory{7ull << 30, "MemAvailable in /proc/meminfo"}); });
  EXPECT_HAS(e, "train_micro_batch_size_per_gpu 100000000: training needs about 4.0 GiB of host memory per rank "
                "(activations 3.0 GiB, micro-batch buffers 1.0 GiB, parameters 0.0 MiB");
  EXPECT_HAS(e, "micro-batches of 500000 sequences x 16 tokens), x 2 ranks on this machine = 8.0 GiB, more than "
                "the 7.0 GiB available (MemAvailable in /proc/meminfo); lower train_micro_batch_size_per_gpu");
}

}  // namespace
