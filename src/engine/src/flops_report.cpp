// format_flops_profile: the profile in the layout of DeepSpeed's print_model_profile (its
// labels, number formats and the PyTorch-style module tree), written from our numbers.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

#include "ds/engine/flops_profiler.h"

namespace ds::engine {

namespace {

// DeepSpeed's number_to_string: a unit prefix and the value rounded to 2 decimals ("%g").
std::string number(double v) {
  struct Unit { double magnitude; const char* name; };
  static const Unit units[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "K"}};
  Unit u{1, ""};
  for (const Unit& c : units) {
    if (v >= c.magnitude) { u = c; break; }
  }
  if (u.magnitude == 1 && v != 0 && v < 1) u = v >= 1e-3 ? Unit{1e-3, "m"} : Unit{1e-6, "u"};
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g %s", std::round(v / u.magnitude * 100) / 100, u.name);
  return buf;
}
std::string params_text(double v) {
  std::string s = number(v);
  std::replace(s.begin(), s.end(), 'G', 'B');
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}
std::string macs_text(double v) { return number(v) + "MACs"; }
std::string flops_rate(double v) { return number(v) + "FLOPS"; }
std::string duration(double s) { return number(s) + "s"; }
std::string percent(double part, double whole) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g%%", whole > 0 ? std::round(10000 * part / whole) / 100 : 0.0);
  return buf;
}

// '{:<70}  {:<8}'
void line(std::ostringstream& os, const std::string& label, const std::string& value) {
  os << label << std::string(label.size() < 70 ? 70 - label.size() : 0, ' ') << "  " << value << "\n";
}

void summary(std::ostringstream& os, const FlopsSummary& s, const ModuleProfile* tree) {
  const double params = tree ? double(tree->totals()[0].params) : double(s.params);
  const double macs = tree ? tree->totals()[0].macs : 0, flops = 2 * macs;
  const double bwd_factor = 2 + (tree && tree->recomputes_forward ? 1 : 0);
  const auto factor = [](double f) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%g", f);
    return std::string(buf);
  };
  line(os, "world size: ", std::to_string(s.world_size));
  line(os, "data parallel size: ", std::to_string(s.world_size));
  line(os, "model parallel size: ", "1");
  line(os, "batch size per GPU: ", std::to_string(s.micro_batch));
  line(os, "params per GPU: ", params_text(params));
  line(os, "params of model = params per GPU * mp_size: ", params_text(params));
  if (tree) {
    line(os, "fwd MACs per GPU: ", macs_text(macs));
    line(os, "fwd flops per GPU: ", number(flops));
    line(os, "fwd flops of model = fwd flops per GPU * mp_size: ", number(flops));
  }
  line(os, "fwd latency: ", duration(s.fwd_s));
  if (tree) line(os, "fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", flops_rate(flops / s.fwd_s));
  line(os, "bwd latency: ", duration(s.bwd_s));
  if (tree) {
    line(os, "bwd FLOPS per GPU = " + factor(bwd_factor) + " * fwd flops per GPU / bwd latency: ",
         flops_rate(bwd_factor * flops / s.bwd_s));
    line(os, "fwd+bwd FLOPS per GPU = " + factor(bwd_factor + 1) + " * fwd flops per GPU / (fwd+bwd latency): ",
         flops_rate((bwd_factor + 1) * flops / (s.fwd_s + s.bwd_s)));
  }
  line(os, "step latency: ", duration(s.step_s));
  const double iter = s.fwd_s + s.bwd_s + s.step_s;
  line(os, "iter latency: ", duration(iter));
  if (tree)
    line(os, "FLOPS per GPU = " + factor(bwd_factor + 1) + " * fwd flops per GPU / iter latency: ",
         flops_rate((bwd_factor + 1) * flops / iter));
  char sps[32];
  std::snprintf(sps, sizeof sps, "%g", std::round(double(s.micro_batch * s.world_size) / iter * 100) / 100);
  line(os, "samples/second: ", sps);
}

// The deepest depth shown: module_depth, or every depth at -1.
int shown_depth(const ModuleProfile& tree, std::int64_t module_depth) {
  int deepest = 0;
  for (const ModuleStats& m : tree.modules()) deepest = std::max(deepest, m.depth);
  return module_depth < 0 ? deepest : int(std::min<std::int64_t>(module_depth, deepest));
}

// "{'Block': '1.2 M', 'Linear': ...}": the top k types of one depth by one measure.
using TypeSums = std::map<std::string, ModuleProfile::Totals>;
std::string top_types(const TypeSums& sums, std::int64_t k, double (*measure)(const ModuleProfile::Totals&),
                      std::string (*text)(double)) {
  std::vector<std::pair<std::string, double>> v;
  for (const auto& [type, t] : sums) v.emplace_back(type, measure(t));
  std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::string out = "{";
  for (std::size_t i = 0; i < v.size() && std::int64_t(i) < k; ++i)
    out += (i ? ", '" : "'") + v[i].first + "': '" + text(v[i].second) + "'";
  return out + "}";
}

void aggregated(std::ostringstream& os, const ModuleProfile& tree, const config::FlopsProfilerConfig& cfg) {
  const auto totals = tree.totals();
  std::vector<TypeSums> by_depth(std::size_t(shown_depth(tree, cfg.module_depth) + 1));
  for (std::size_t i = 0; i < tree.modules().size(); ++i) {
    const ModuleStats& m = tree.modules()[i];
    if (std::size_t(m.depth) >= by_depth.size()) continue;
    ModuleProfile::Totals& t = by_depth[std::size_t(m.depth)][m.type];
    t.params += totals[i].params;
    t.macs += totals[i].macs;
    t.seconds += totals[i].seconds;
  }
  os << "Top " << cfg.top_modules << " modules in terms of params, MACs or fwd latency at different model depths:\n";
  for (std::size_t d = 0; d < by_depth.size(); ++d) {
    os << "depth " << d << ":\n";
    os << "    params      - "
       << top_types(by_depth[d], cfg.top_modules, [](const auto& t) { return double(t.params); }, params_text) << "\n";
    os << "    MACs        - " << top_types(by_depth[d], cfg.top_modules, [](const auto& t) { return t.macs; }, macs_text)
       << "\n";
    os << "    fwd latency - "
       << top_types(by_depth[d], cfg.top_modules, [](const auto& t) { return t.seconds; }, duration) << "\n";
  }
}

// One module as PyTorch prints it, its profile first, then its children down to `depth`.
void module_lines(std::ostringstream& os, const ModuleProfile& tree, const std::vector<ModuleProfile::Totals>& totals,
                  const std::vector<std::vector<int>>& children, int i, int depth) {
  const ModuleStats& m = tree.modules()[std::size_t(i)];
  const ModuleProfile::Totals& t = totals[std::size_t(i)];
  const ModuleProfile::Totals& all = totals[0];
  const std::string pad(std::size_t(2 * m.depth), ' ');
  const std::string stats = params_text(double(t.params)) + " = " + percent(double(t.params), double(all.params)) +
                            " Params, " + macs_text(t.macs) + " = " + percent(t.macs, all.macs) + " MACs, " +
                            number(2 * t.macs) + "flops, " + duration(t.seconds) + " = " +
                            percent(t.seconds, all.seconds) + " latency, " +
                            flops_rate(t.seconds > 0 ? 2 * t.macs / t.seconds : 0);
  const std::string name = m.parent < 0 ? "" : "(" + m.name.substr(m.name.rfind('.') + 1) + "): ";
  const auto& kids = children[std::size_t(i)];
  if (kids.empty() || m.depth >= depth) {
    os << pad << name << m.type << "(" << stats << ")\n";
    return;
  }
  os << pad << name << m.type << "(\n" << pad << "  " << stats << "\n";
  for (int c : kids) module_lines(os, tree, totals, children, c, depth);
  os << pad << ")\n";
}

void detailed(std::ostringstream& os, const ModuleProfile& tree, const config::FlopsProfilerConfig& cfg) {
  os << "Each module profile is listed after its name in the following order: \n"
        "params, percentage of total params, MACs, percentage of total MACs, flops, fwd latency, percentage of "
        "total fwd latency, fwd FLOPS\n\n"
        "Note: 1. A module's own ops that are not modules (attention's score products, activations, the loss) "
        "are not printed. However they make up the difference between a parent's MACs (or latency) and the sum "
        "of its submodules'.\n"
        "2. Number of floating-point operations is a theoretical estimation (2 per MAC of the matrix products), "
        "thus FLOPS computed using that could be larger than the maximum system throughput.\n"
        "3. The fwd latency listed in the top module's profile is the sum of its ops' times, thus it's less than "
        "the fwd latency shown above which is captured in the engine.\n\n";
  std::vector<std::vector<int>> children(tree.modules().size());
  for (std::size_t i = 1; i < tree.modules().size(); ++i)
    children[std::size_t(tree.modules()[i].parent)].push_back(int(i));
  module_lines(os, tree, tree.totals(), children, 0, shown_depth(tree, cfg.module_depth));
}

}  // namespace

std::string format_flops_profile(const FlopsSummary& s, const ModuleProfile* tree,
                                 const config::FlopsProfilerConfig& cfg) {
  std::ostringstream os;
  os << "\n-------------------------- DeepSpeed Flops Profiler --------------------------\n"
     << "Profile Summary at step " << s.step << ":\n"
     << "Notations:\n"
        "data parallel size (dp_size), model parallel size(mp_size),\n"
        "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
        "number of floating-point operations (flops), floating-point operations per second (FLOPS),\n"
        "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
        "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n\n";
  summary(os, s, tree);
  if (tree && !tree->modules().empty()) {
    os << "\n----------------------------- Aggregated Profile per GPU -----------------------------\n";
    aggregated(os, *tree, cfg);
    if (cfg.detailed) {
      os << "\n------------------------------ Detailed Profile per GPU ------------------------------\n";
      detailed(os, *tree, cfg);
    }
  } else {
    os << "\n(no per-module profile: the model does not describe its modules)\n";
  }
  os << "------------------------------------------------------------------------------\n";
  return os.str();
}

}  // namespace ds::engine
