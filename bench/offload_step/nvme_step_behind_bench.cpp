// The NVMe-offloaded AdamW step (NvmeSwap::step) in a training loop's rhythm: --steps steps
// with --compute_ms of busy work after each (the next forward and backward), then map(), which
// waits for every transfer (as a checkpoint save would). Two loops over the same swap, one
// after the other, --rounds times (so both see the same machine):
//   behind: step(), compute -- the step's last writes may still be in flight during the compute
//           (the next step's reads wait for them);
//   waited: step(), map()+unmap() (waits for every transfer: what step() did itself before its
//           writes went behind), compute.
// Figures: the median of the seconds until step() returns (steps 2.. of each loop) and the
// seconds per step of the whole loop (its wall time / steps, the final wait included).
// Headline: waited / behind seconds per step (> 1: the writes behind pay). Check: after all
// the steps the swap files equal the same AdamW steps in memory bit for bit.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench_report.h"
#include "nvme_adamw_fixture.h"

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Busy work on this thread (forward and backward keep the cores busy; a sleep would not).
void compute(double ms) {
  const auto t0 = Clock::now();
  volatile double x = 1;
  while (since(t0) * 1e3 < ms) x = x * 1.0000001 + 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp";
  std::size_t elements = std::size_t(64) << 20, sub_group = std::size_t(8) << 20;
  int buffer_count = 4, steps = 6, rounds = 2;
  double excluded = 0;
  double compute_ms = 300;
  CLI::App app{"nvme_step_behind_bench: the NVMe step's writes behind, with compute between the steps"};
  app.add_option("--dir", dir, "nvme_path: the directory of the swap files");
  app.add_option("--elements", elements, "parameters in the step (master + 2 moments: 12 bytes each on disk)");
  app.add_option("--sub_group", sub_group, "zero_optimization.sub_group_size");
  app.add_option("--buffer_count", buffer_count, "offload_optimizer.buffer_count")->check(CLI::PositiveNumber);
  app.add_option("--steps", steps, "steps of each loop (medians over steps 2..)")->check(CLI::Range(2, 1000));
  app.add_option("--rounds", rounds, "rounds of the two loops")->check(CLI::PositiveNumber);
  app.add_option("--compute_ms", compute_ms, "busy work between the steps (forward + backward)");
  CLI11_PARSE(app, argc, argv);
  ds::bench::Report rep("nvme_step_behind_bench");
  try {
    ds::bench::NvmeAdamwFixture f(dir, elements, sub_group, buffer_count);
    ds::engine::NvmeSwap& swap = *f.swap;
    std::vector<double> ret[2], per_step[2];  // [0] behind, [1] waited
    int s = 0;
    for (int round = 0; round < rounds; ++round)
      for (int mode = 0; mode < 2; ++mode) {
        const auto loop0 = Clock::now();
        for (int k = 0; k < steps; ++k) {
          ds::optim::StepContext ctx;
          ctx.lr = 1e-3;
          ctx.step = ++s;
          const auto t0 = Clock::now();
          f.step_swapped(ctx);
          if (k > 0) ret[mode].push_back(since(t0));
          if (mode == 1) {
            swap.map();
            swap.unmap(false);
          }
          compute(compute_ms);
          // The reference's step runs outside the loop's clock.
          const auto r0 = Clock::now();
          f.step_reference(ctx);
          excluded += since(r0);
        }
        swap.map();
        swap.unmap(false);
        per_step[mode].push_back((since(loop0) - excluded) / steps);
        excluded = 0;
        std::printf("round %d %s: %.3f s per step (step() returned after %.3f s, median)\n", round,
                    mode ? "waited" : "behind", per_step[mode].back(),
                    ds::bench::median(std::vector<double>(ret[mode].end() - (steps - 1), ret[mode].end())));
      }
    f.check(rep);
    using ds::bench::median;
    rep["elements"] = elements;
    rep["sub_group"] = swap.sub_group();
    rep["buffer_count"] = buffer_count;
    rep["compute_ms"] = compute_ms;
    rep["behind_return_s"] = median(ret[0]);
    rep["waited_return_s"] = median(ret[1]);
    rep["behind_step_s"] = median(per_step[0]);
    rep["waited_step_s"] = median(per_step[1]);
    std::printf("%zu elements, sub_group %zu, buffers %d, compute %.0f ms: step() returns after %.3f s (behind) / "
                "%.3f s (waited); per step in all %.3f s / %.3f s\n",
                elements, swap.sub_group(), buffer_count, compute_ms, median(ret[0]), median(ret[1]),
                median(per_step[0]), median(per_step[1]));
    rep.headline("waited / behind seconds per step in all (median of the rounds)", median(per_step[1]) / median(per_step[0]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "nvme_step_behind_bench: error: %s\n", e.what());
    return 1;
  }
  return rep.finish();
}
