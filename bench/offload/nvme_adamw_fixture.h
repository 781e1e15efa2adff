// What the NVMe step benchmarks share (nvme_step_bench, nvme_step_behind_bench): AdamW whose
// fp32 master and moments live in NvmeSwap files, the same AdamW in memory as the reference,
// random master values and gradients, and the check that the two agree bit for bit.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_report.h"
#include "ds/config/ds_config.h"
#include "ds/optim/optimizer.h"
#include "nvme_swap.h"

namespace ds::bench {

struct NvmeAdamwFixture {
  std::unique_ptr<optim::Optimizer> opt, ref;  // the swapped one and the in-memory reference
  std::unique_ptr<engine::NvmeSwap> swap;
  std::vector<float> master, grad;              // the reference's master; the gradients
  std::vector<std::uint16_t> working, ref_working;  // bf16 working params of each

  // `elements` parameters; swap files under `dir` (offload_optimizer.nvme_path), sub-groups of
  // `sub_group`, `buffer_count` buffers, the aio settings `aio`.
  NvmeAdamwFixture(const std::string& dir, std::size_t elements, std::size_t sub_group, int buffer_count,
                   const io::AioOptions& aio = {})
      : master(elements), grad(elements), working(elements), ref_working(elements) {
    config::OptimizerConfig oc;
    oc.type = "adamw";
    oc.lr = 1e-3;
    oc.weight_decay = 0.01;
    opt = optim::make_optimizer(oc, optim::Kernel::Cpu);
    ref = optim::make_optimizer(oc, optim::Kernel::Cpu);
    ref->init_state(elements);
    engine::NvmeOptions o;
    o.optimizer = true;
    o.optimizer_path = dir;
    o.optimizer_key = "--dir";
    o.sub_group = sub_group;
    o.buffer_count = buffer_count;
    o.aio = aio;
    swap = std::make_unique<engine::NvmeSwap>(o, 0, elements, *opt, DType::BF16);
    std::mt19937 g(5);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& v : master) v = nd(g);
    for (auto& v : grad) v = nd(g) * 1e-2f;
    swap->write_master(0, elements, master.data());
  }

  TensorView grads() { return TensorView{grad.data(), grad.size(), DType::F32}; }
  // One step of each: the swapped optimizer, then the reference.
  void step_swapped(const optim::StepContext& ctx) {
    swap->step(*opt, grads(), TensorView{working.data(), working.size(), DType::BF16}, ctx);
  }
  void step_reference(const optim::StepContext& ctx) {
    ref->step(master, grads(), TensorView{ref_working.data(), ref_working.size(), DType::BF16}, {}, ctx);
  }

  // The swap files (master, moments) and the working params against the reference's.
  void check(Report& rep) {
    const engine::StateViews v = swap->map();
    const std::size_t n = master.size();
    std::size_t bad = std::memcmp(v.master.data(), master.data(), n * 4) != 0;
    auto st = ref->state_tensors();
    for (std::size_t t = 0; t < st.size(); ++t) bad += std::memcmp(v.state[t].second.data(), st[t].second.data(), n * 4) != 0;
    bad += working != ref_working;
    swap->unmap(false);
    rep.check("master, exp_avg, exp_avg_sq and bf16 params equal in-memory AdamW after every step", bad == 0,
              std::to_string(bad) + " of 4 arrays differ");
  }
};

}  // namespace ds::bench
