// DeepSpeed's flops profiler (the config's flops_profiler section): global rank 0 times the
// forwards, backwards and the optimizer step of one step -- the one that starts when
// profile_step steps are done (DeepSpeed's global_steps == profile_step) -- hands the module
// a ModuleProfile (ds/core/module_profile.h) for each forward of it, and at the step's end
// prints the profile in DeepSpeed's layout (print_model_profile): the summary, the top
// modules per depth, the module tree. Every other step, and every other rank, costs one
// comparison per call.
#pragma once

#include <cstdint>
#include <string>

#include "ds/config/ds_config.h"
#include "ds/core/module.h"
#include "ds/core/module_profile.h"
#include "ds/core/timer.h"

namespace ds::engine {

// The numbers of the profiled step beside the module tree.
struct FlopsSummary {
  std::int64_t step = 0;  // DeepSpeed's global_steps at the step's start
  int world_size = 1;
  std::int64_t micro_batch = 1;  // samples per rank per forward
  std::int64_t params = 0;       // the module's parameters (when it has no tree)
  double fwd_s = 0, bwd_s = 0;   // means over the step's micro-batches
  double step_s = 0;             // the boundary: gradient reduction's end and the optimizer
};

// The profile as DeepSpeed prints it; `tree` null: the summary without MACs and FLOPs.
std::string format_flops_profile(const FlopsSummary& s, const ModuleProfile* tree,
                                 const config::FlopsProfilerConfig& cfg);

enum class FlopsPhase { Forward, Backward, Step };

class FlopsProfiler {
 public:
  // rank0: whether this rank prints (the others only compare step counts).
  FlopsProfiler(const config::FlopsProfilerConfig& cfg, Module& module, bool rank0, int world_size,
                std::int64_t micro_batch);
  // Around each engine call of its phase; global_steps: the engine's completed steps.
  void begin(FlopsPhase phase, std::int64_t global_steps);
  // Ends the phase begun; after the profiled step's Step, prints the profile (stdout or
  // output_file; throws ds::Error naming the file when it cannot be written).
  void end(FlopsPhase phase);

 private:
  void print() const;

  config::FlopsProfilerConfig cfg_;
  Module& module_;
  bool rank0_;
  FlopsSummary sum_;
  ModuleProfile tree_;
  bool has_tree_ = false;
  bool active_ = false;  // inside a phase of the profiled step
  int forwards_ = 0, backwards_ = 0;
  Stopwatch clock_;
};

}  // namespace ds::engine
