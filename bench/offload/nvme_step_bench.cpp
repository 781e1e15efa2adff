// The optimizer step of NVMe offload (zero_optimization.offload_optimizer device "nvme"):
// AdamW over --elements fp32 master weights whose master and moments live in swap files, streamed
// --sub_group elements at a time through --buffer_count buffer sets (the engine's NvmeSwap). Its
// figure: the bytes the step reads and writes per second, against dd's direct-I/O bandwidth on
// the same directory measured by run.sh in the same run (--dd_read_gbs / --dd_write_gbs):
//   ratio = (R + W) / step_seconds  /  ((R + W) / (R / dd_read + W / dd_write))
// i.e. the step's time against the time dd needs to read and write the same bytes. Check: after
// the steps, the swap files hold exactly what the same AdamW steps give in memory.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_report.h"
#include "ds/config/ds_config.h"
#include "ds/optim/optimizer.h"
#include "nvme_swap.h"

int main(int argc, char** argv) {
  std::string dir = "/tmp", min_ratio_s = "0";
  std::size_t elements = std::size_t(128) << 20, sub_group = std::size_t(8) << 20, block_size = 1 << 20;
  int buffer_count = 4, queue_depth = 8, thread_count = 1, steps = 3;
  double dd_read = 0, dd_write = 0;
  CLI::App app{"nvme_step_bench: the NVMe-offloaded AdamW step's throughput against dd"};
  app.add_option("--dir", dir, "nvme_path: the directory of the swap files");
  app.add_option("--elements", elements, "parameters in the step (master + 2 moments: 12 bytes each on disk)");
  app.add_option("--sub_group", sub_group, "zero_optimization.sub_group_size");
  app.add_option("--buffer_count", buffer_count, "offload_optimizer.buffer_count")->check(CLI::PositiveNumber);
  app.add_option("--block_size", block_size, "aio.block_size");
  app.add_option("--queue_depth", queue_depth, "aio.queue_depth");
  app.add_option("--thread_count", thread_count, "aio.thread_count");
  app.add_option("--steps", steps, "steps timed (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--dd_read_gbs", dd_read, "dd iflag=direct read GB/s on --dir (reference)");
  app.add_option("--dd_write_gbs", dd_write, "dd oflag=direct write GB/s on --dir (reference)");
  app.add_option("--min_ratio", min_ratio_s, "fail (exit 3) below this ratio");
  CLI11_PARSE(app, argc, argv);
  ds::bench::Report rep("nvme_step_bench");
  rep.min_ratio(ds::bench::parse_min_ratio("nvme_step_bench", min_ratio_s));
  try {
    ds::config::OptimizerConfig oc;
    oc.type = "adamw";
    oc.lr = 1e-3;
    oc.weight_decay = 0.01;
    auto opt = ds::optim::make_optimizer(oc, ds::optim::Kernel::Cpu);
    auto ref = ds::optim::make_optimizer(oc, ds::optim::Kernel::Cpu);
    ref->init_state(elements);
    ds::engine::NvmeOptions o;
    o.optimizer = true;
    o.optimizer_path = dir;
    o.optimizer_key = "--dir";
    o.sub_group = sub_group;
    o.buffer_count = buffer_count;
    o.aio = {block_size, queue_depth, thread_count};
    ds::engine::NvmeSwap swap(o, 0, elements, *opt, ds::DType::BF16);
    std::vector<float> master(elements), grad(elements);
    std::mt19937 g(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : master) v = nd(g);
    for (auto& v : grad) v = nd(g) * 1e-2f;
    swap.write_master(0, elements, master.data());
    std::vector<std::uint16_t> working(elements), ref_working(elements);
    std::vector<double> secs, gbs;
    for (int s = 1; s <= steps; ++s) {
      ds::optim::StepContext ctx;
      ctx.lr = 1e-3;
      ctx.step = s;
      swap.step(*opt, ds::TensorView{grad.data(), elements, ds::DType::F32},
                ds::TensorView{working.data(), elements, ds::DType::BF16}, ctx);
      ref->step(master, ds::TensorView{grad.data(), elements, ds::DType::F32},
                ds::TensorView{ref_working.data(), elements, ds::DType::BF16}, {}, ctx);
      secs.push_back(swap.last_step_seconds());
      gbs.push_back(double(swap.last_step_bytes()) / swap.last_step_seconds() / 1e9);
      std::printf("step %d: %.3f s, %.2f GB read+written, %.3f GB/s\n", s, secs.back(), swap.last_step_bytes() / 1e9,
                  gbs.back());
    }
    // Check: the files and the working params equal the in-memory steps bit for bit.
    const ds::engine::StateViews v = swap.map();
    std::size_t bad = 0;
    bad += std::memcmp(v.master.data(), master.data(), elements * 4) != 0;
    auto st = ref->state_tensors();
    for (std::size_t t = 0; t < st.size(); ++t) bad += std::memcmp(v.state[t].second.data(), st[t].second.data(), elements * 4) != 0;
    bad += working != ref_working;
    swap.unmap(false);
    rep.check("master, exp_avg, exp_avg_sq and bf16 params equal in-memory AdamW after every step", bad == 0,
              std::to_string(bad) + " of 4 arrays differ");
    const double med = ds::bench::median(gbs);
    rep["elements"] = elements;
    rep["sub_group"] = swap.sub_group();
    rep["buffer_count"] = buffer_count;
    rep["step_seconds_median"] = ds::bench::median(secs);
    rep["step_gbs_median"] = med;
    std::printf("nvme step: %zu elements, sub_group %zu, buffers %d: median %.3f s, %.3f GB/s read+written\n", elements,
                swap.sub_group(), buffer_count, ds::bench::median(secs), med);
    if (dd_read > 0 && dd_write > 0) {
      // dd reading `bytes` and writing `bytes`: 2 x bytes over the sum of the two times.
      const double dd_gbs = 2.0 / (1.0 / dd_read + 1.0 / dd_write);
      rep["dd_read_gbs"] = dd_read;
      rep["dd_write_gbs"] = dd_write;
      rep["dd_read_plus_write_gbs"] = dd_gbs;
      std::printf("dd: read %.3f GB/s, write %.3f GB/s: the same bytes at %.3f GB/s\n", dd_read, dd_write, dd_gbs);
      rep.headline("NVMe step read+write GB/s / dd read+write GB/s (median of steps)", med / dd_gbs);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_step_bench: error: %s\n", e.what());
    return 1;
  }
  return rep.finish();
}
