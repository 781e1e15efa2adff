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
#include "nvme_adamw_fixture.h"

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
    ds::bench::NvmeAdamwFixture f(dir, elements, sub_group, buffer_count, {block_size, queue_depth, thread_count});
    ds::engine::NvmeSwap& swap = *f.swap;
    std::vector<double> secs, gbs;
    for (int s = 1; s <= steps; ++s) {
      ds::optim::StepContext ctx;
      ctx.lr = 1e-3;
      ctx.step = s;
      f.step_swapped(ctx);
      f.step_reference(ctx);
      secs.push_back(swap.last_step_seconds());
      gbs.push_back(double(swap.last_step_bytes()) / swap.last_step_seconds() / 1e9);
      std::printf("step %d: %.3f s, %.2f GB read+written, %.3f GB/s\n", s, secs.back(), swap.last_step_bytes() / 1e9,
                  gbs.back());
    }
    // Check: the files and the working params equal the in-memory steps bit for bit.
    f.check(rep);
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
