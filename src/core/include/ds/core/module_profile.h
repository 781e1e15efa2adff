// What the flops profiler (DeepSpeed's flops_profiler; ds/engine/flops_profiler.h) learns
// from a model about one forward: its modules as a tree, each with its parameters, and the
// multiply-accumulates and elapsed time of the module's own ops -- those it runs outside its
// child modules (attention's score products in "attn", the loss in the model). A module's
// totals are its own plus its children's (totals()), as DeepSpeed sums a module's children.
//
// A model fills it through Module::set_module_profile (ds/core/module.h): the tree when the
// profile is handed over, MACs and times at each forward until it is taken back.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ds {

struct ModuleStats {
  std::string name;  // the path, as the parameter names use it ("h.0.attn"); the model: ""
  std::string type;  // what it is ("Attention"): the detailed profile prints it, the aggregated one groups by it
  int parent = -1;   // index of the enclosing module; -1 for the model
  int depth = 0;     // the model 0, its children 1, ...
  std::int64_t params = 0;  // own parameters (not the children's)
  double macs = 0;          // own ops' multiply-accumulates in the forward
  double seconds = 0;       // own ops' elapsed time in the forward
};

class ModuleProfile {
 public:
  // Appends a module (parents before their children); returns its index.
  int add(std::string name, std::string type, int parent, std::int64_t params = 0) {
    ModuleStats m;
    m.name = std::move(name);
    m.type = std::move(type);
    m.parent = parent;
    m.depth = parent < 0 ? 0 : modules_[std::size_t(parent)].depth + 1;
    m.params = params;
    modules_.push_back(std::move(m));
    return int(modules_.size()) - 1;
  }
  void add_macs(int module, double macs) { modules_[std::size_t(module)].macs += macs; }
  void add_seconds(int module, double s) { modules_[std::size_t(module)].seconds += s; }
  void clear() { modules_.clear(); }
  const std::vector<ModuleStats>& modules() const { return modules_; }

  // Per module: own plus every descendant's params, MACs and seconds.
  struct Totals {
    std::int64_t params = 0;
    double macs = 0, seconds = 0;
  };
  std::vector<Totals> totals() const {
    std::vector<Totals> t(modules_.size());
    for (std::size_t i = modules_.size(); i-- > 0;) {  // children come after their parents
      const ModuleStats& m = modules_[i];
      t[i].params += m.params;
      t[i].macs += m.macs;
      t[i].seconds += m.seconds;
      if (m.parent >= 0) {
        Totals& p = t[std::size_t(m.parent)];
        p.params += t[i].params;
        p.macs += t[i].macs;
        p.seconds += t[i].seconds;
      }
    }
    return t;
  }

  // Whether the model recomputes its forward in backward (activation checkpointing): the
  // backward then does 3x the forward's FLOPs, not 2x (DeepSpeed's recompute_fwd_factor).
  bool recomputes_forward = false;

 private:
  std::vector<ModuleStats> modules_;
};

// Adds the elapsed time of its scope to one module's own time; does nothing when the
// profile is null (profiling off: one branch).
class ModuleTimer {
 public:
  ModuleTimer(ModuleProfile* profile, int module) : profile_(profile), module_(module) {
    if (profile_) start_ = clock::now();
  }
  ~ModuleTimer() {
    if (profile_) profile_->add_seconds(module_, std::chrono::duration<double>(clock::now() - start_).count());
  }
  ModuleTimer(const ModuleTimer&) = delete;
  ModuleTimer& operator=(const ModuleTimer&) = delete;

 private:
  using clock = std::chrono::steady_clock;
  ModuleProfile* profile_;
  int module_;
  clock::time_point start_{};
};

}  // namespace ds
