// The flops profiler's timing of the profiled step and its output (ds/engine/flops_profiler.h).
#include "ds/engine/flops_profiler.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ds/core/error.h"

namespace ds::engine {

FlopsProfiler::FlopsProfiler(const config::FlopsProfilerConfig& cfg, Module& module, bool rank0, int world_size,
                             std::int64_t micro_batch)
    : cfg_(cfg), module_(module), rank0_(rank0) {
  sum_.world_size = world_size;
  sum_.micro_batch = micro_batch;
  sum_.step = cfg.profile_step;
}

void FlopsProfiler::begin(FlopsPhase phase, std::int64_t global_steps) {
  active_ = rank0_ && global_steps == cfg_.profile_step;
  if (!active_) return;
  // Each forward of the step starts the tree afresh, as DeepSpeed's start_profile does: the
  // tree shows the last micro-batch's forward.
  if (phase == FlopsPhase::Forward) has_tree_ = module_.set_module_profile(&tree_);
  clock_.reset();
}

void FlopsProfiler::end(FlopsPhase phase) {
  if (!active_) return;
  active_ = false;
  const double s = clock_.elapsed_s();
  switch (phase) {
    case FlopsPhase::Forward:
      module_.set_module_profile(nullptr);
      sum_.fwd_s += s;
      ++forwards_;
      return;
    case FlopsPhase::Backward:
      sum_.bwd_s += s;
      ++backwards_;
      return;
    case FlopsPhase::Step:
      sum_.step_s = s;
      if (forwards_ > 0) sum_.fwd_s /= forwards_;
      if (backwards_ > 0) sum_.bwd_s /= backwards_;
      for (const ParamInfo& p : module_.parameters()) sum_.params += std::int64_t(p.numel());
      print();
      return;
  }
}

void FlopsProfiler::print() const {
  const std::string text = format_flops_profile(sum_, has_tree_ ? &tree_ : nullptr, cfg_);
  const std::string path = cfg_.output_file.value_or("");
  if (path.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  const std::filesystem::path file(path);
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  std::ofstream out(file, std::ios::trunc);
  out << text;
  out.close();
  DS_CHECK(!ec && out.good(), "flops_profiler.output_file " << path << ": cannot write the profile there"
                                                             << (ec ? " (" + ec.message() + ")" : std::string()));
}

}  // namespace ds::engine
