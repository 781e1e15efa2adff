// ds_config.json -> DsConfig, following DeepSpeed's runtime/config.py rules
// (keys, types and defaults) with stricter, located errors.
#include "ds/config/parse.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <sys/stat.h>

#include "ds/config/json_reader.h"
#include "ds/config/registry.h"
#include "ds/core/base64.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/log.h"
#include "schema.h"
#include "validate_parsed.h"

namespace ds::config {

namespace {

using K = JsonNode::Kind;
using Member = JsonNode::Member;
constexpr std::int64_t kIntMax = std::numeric_limits<std::int64_t>::max();
constexpr double kInf = std::numeric_limits<double>::infinity();

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Case-insensitive Levenshtein distance (keys are short; O(n*m) is fine).
size_t edit_distance(const std::string& a_in, const std::string& b_in) {
  const std::string a = lower(a_in), b = lower(b_in);
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The closest candidate if it is close enough to be a plausible typo.
std::string closest(const std::string& key, const std::vector<std::string>& candidates) {
  if (key.size() > 200) return {};  // not a typo; keeps the cost bounded on hostile input
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    const size_t d = edit_distance(key, c);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  const size_t limit = std::max<size_t>(2, key.size() / 3);
  if (best.empty() || best_d > limit || best_d >= key.size()) return {};
  return best;
}

std::string jquote(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string join(const std::vector<std::string>& v, const char* sep = ", ") {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

// Where the keys of the sections live, to point a misplaced key at its real section
// ("loss_scale" under bf16 belongs in fp16: DeepSpeed issue #1809's complaint).
const std::vector<std::pair<std::string, std::vector<std::string>>>& section_keys() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> table = {
      {"fp16", {"enabled", "auto_cast", "loss_scale", "initial_scale_power", "loss_scale_window",
                "hysteresis", "consecutive_hysteresis", "min_loss_scale"}},
      {"bf16", {"enabled", "check_grad_overflow"}},
      {"zero_optimization", {"stage", "contiguous_gradients", "reduce_scatter", "reduce_bucket_size",
                             "allgather_bucket_size", "allgather_partitions", "overlap_comm"}},
      {"checkpoint", {"tag_validation", "async_save", "io_threads"}},
      {"data_types", {"grad_accum_dtype"}},
      {"csv_monitor", {"enabled", "output_path", "job_name"}},
      {"comms_config", {"timeout"}},
      {"communication", {"shared_memory", "progress_thread"}},
      {"kernels", {"attention", "attention_block", "cpu_bf16_gemm"}},
      {"optimizer.params", {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode",
                            "momentum", "dampening", "nesterov", "max_coeff", "min_coeff",
                            "eps_inside_sqrt", "lr_decay", "initial_accumulator_value"}},
      {"scheduler.params", {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                            "total_num_steps", "warmup_min_ratio", "cos_min_ratio", "cycle_min_lr",
                            "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
                            "cycle_second_step_size", "cycle_first_stair_count",
                            "cycle_second_stair_count", "decay_step_size", "cycle_momentum",
                            "cycle_min_mom", "cycle_max_mom", "decay_mom_rate",
                            "lr_range_test_min_lr", "lr_range_test_step_size",
                            "lr_range_test_step_rate", "lr_range_test_staircase"}},
  };
  return table;
}

// The section (other than `except`) that has `key`, or "".
std::string section_of(const std::string& key, const std::string& except) {
  for (const auto& [section, keys] : section_keys()) {
    if (section == except) continue;
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) return section;
  }
  return {};
}

struct Ctx {
  std::string source;
  std::vector<std::string>* warnings = nullptr;
  std::vector<std::string>* keys = nullptr;  // config_keys(): every key path a section knows
  detail::KeyPositions pos;  // key path -> where the key was written

  std::string where(SourcePos p) const {
    if (!p.known()) return source;
    return source + ":" + std::to_string(p.line) + ":" + std::to_string(p.column);
  }
  [[noreturn]] void fail(SourcePos p, const std::string& path, const std::string& message) const {
    DS_THROW(where(p) << ": " << (path.empty() ? "" : path + ": ") << message);
  }
  // A failure about a key already read (cross-field checks).
  [[noreturn]] void fail_key(const std::string& path, const std::string& message) const {
    auto it = pos.find(path);
    fail(it == pos.end() ? SourcePos{} : it->second, path, message);
  }
  void warn(SourcePos p, const std::string& message) {
    const std::string text = where(p) + ": " + message;
    if (warnings) warnings->push_back(text);
    if (ds::process_rank() <= 0) DS_WARN(text);  // every rank reads the config; say it once
  }
};

Range any_number() { return Range::any(); }
Range at_least(double v) { return Range::at_least(v); }
Range above(double v) { return Range::above(v); }
Range unit_open() { return Range::unit_open(); }

bool is_auto(const JsonNode& n) { return n.kind == K::String && n.str == "auto"; }

// One JSON object of the config: typed getters mark keys as known; finish() rejects the rest.
class Section {
 public:
  Section(Ctx& ctx, const JsonNode& node, SourcePos key_pos, std::string path)
      : ctx_(ctx), node_(node), path_(std::move(path)) {
    if (node.kind != K::Object) {
      ctx.fail(key_pos.known() ? key_pos : node.pos, path_, "expected an object, got " + describe(node));
    }
  }

  Ctx& ctx() { return ctx_; }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  // The member for key, or nullptr when absent or "auto" (DeepSpeed drops "auto" values so
  // the default applies). Marks the key as known and remembers its position.
  const Member* get(const std::string& key, bool supported = true) {
    (supported ? supported_ : accepted_).push_back(key);
    if (ctx_.keys) ctx_.keys->push_back(sub(key));
    const Member* m = node_.find(key);
    if (!m) return nullptr;
    ctx_.pos[sub(key)] = m->key_pos;
    if (is_auto(m->value)) return nullptr;
    return m;
  }
  bool has(const std::string& key) const { return node_.find(key) != nullptr; }

  // DeepSpeed keys we accept with any value and do not act on (docs/user/config.md lists them).
  void accept(std::initializer_list<const char*> keys) {
    for (const char* k : keys) {
      accepted_.emplace_back(k);
      if (ctx_.keys) ctx_.keys->push_back(sub(k));
    }
  }

  [[noreturn]] void type_error(const Member& m, const std::string& expected) {
    ctx_.fail(m.key_pos, sub(m.key), "expected " + expected + ", got " + describe(m.value));
  }

  bool read_bool(const Member& m) {
    if (m.value.kind != K::Bool) type_error(m, "true or false");
    return m.value.boolean;
  }
  double read_number(const Member& m, Range r) {
    const std::string expected = "a number" + (r.text().empty() ? "" : " " + r.text());
    if (!m.value.is_number()) type_error(m, expected);
    const double v = m.value.as_double();
    if (!r.contains(v)) type_error(m, expected);
    return v;
  }
  std::int64_t read_int(const Member& m, std::int64_t lo, std::int64_t hi) {
    std::string expected = "an integer";
    if (lo != std::numeric_limits<std::int64_t>::min() && hi != kIntMax) {
      expected += " in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    } else if (lo != std::numeric_limits<std::int64_t>::min()) {
      expected += " >= " + std::to_string(lo);
    }
    std::int64_t v = 0;
    const JsonNode& n = m.value;
    if (n.kind == K::Int) {
      v = n.int_value;
    } else if (n.kind == K::Double && std::floor(n.double_value) == n.double_value &&
               std::abs(n.double_value) < 9.0e15) {
      v = static_cast<std::int64_t>(n.double_value);  // 5e8 is how DeepSpeed configs write sizes
    } else {
      type_error(m, expected);
    }
    if (v < lo || v > hi) type_error(m, expected);
    return v;
  }
  std::string read_string(const Member& m) {
    if (m.value.kind != K::String) type_error(m, "a string");
    return m.value.str;
  }

  // Typed optional fields: left at their default when absent or "auto".
  void boolean(const std::string& key, bool& out) {
    if (const Member* m = get(key)) out = read_bool(*m);
  }
  void number(const std::string& key, double& out, Range r) {
    if (const Member* m = get(key)) out = read_number(*m, r);
  }
  template <class T>
  void integer(const std::string& key, T& out, std::int64_t lo = 0, std::int64_t hi = kIntMax) {
    hi = std::min<std::int64_t>(hi, static_cast<std::int64_t>(std::numeric_limits<T>::max()));
    if (const Member* m = get(key)) out = static_cast<T>(read_int(*m, lo, hi));
  }
  void string(const std::string& key, std::string& out) {
    if (const Member* m = get(key)) out = read_string(*m);
  }
  // Optional fields where null also means "not given".
  void number_opt(const std::string& key, std::optional<double>& out, Range r) {
    if (const Member* m = get(key)) {
      if (m->value.kind == K::Null) out.reset();
      else out = read_number(*m, r);
    }
  }
  void integer_opt(const std::string& key, std::optional<std::int64_t>& out, std::int64_t lo = 0) {
    if (const Member* m = get(key)) {
      if (m->value.kind == K::Null) out.reset();
      else out = read_int(*m, lo, kIntMax);
    }
  }
  // A DeepSpeed bool we accept only at its default (the other value changes behaviour that
  // dstrain does not implement): a clear error instead of silently ignoring it.
  void only_default(const std::string& key, bool default_value, const std::string& why) {
    if (const Member* m = get(key, false)) {
      if (read_bool(*m) != default_value) ctx_.fail(m->key_pos, sub(key), why);
    }
  }

  // Unknown keys are errors, with the closest known key and where a misplaced key belongs.
  void finish() {
    for (const auto& m : node_.members) {
      if (known(m.key)) continue;
      std::vector<std::string> all = supported_;
      all.insert(all.end(), accepted_.begin(), accepted_.end());
      std::string msg = "unknown key in " + path_;
      const std::string guess = closest(m.key, all);
      const std::string elsewhere = section_of(m.key, path_);
      if (!guess.empty()) {
        msg += " (did you mean " + jquote(guess) + "?)";
      } else if (!elsewhere.empty()) {
        msg += " (\"" + m.key + "\" belongs in " + elsewhere + ")";
      }
      std::vector<std::string> keys = supported_;
      std::sort(keys.begin(), keys.end());
      keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
      msg += "; supported keys: " + join(keys);
      ctx_.fail(m.key_pos, sub(m.key), msg);
    }
  }

  // Top level: unknown keys are warnings (DeepSpeed ignores them silently).
  void finish_top_level() {
    std::vector<std::string> all = supported_;
    all.insert(all.end(), accepted_.begin(), accepted_.end());
    std::size_t unknown = 0;
    for (const auto& m : node_.members) {
      if (known(m.key)) continue;
      // A generated or corrupt file can hold millions: warn about the first few, count the rest.
      if (++unknown > kMaxUnknownKeyWarnings) continue;
      std::string msg = "unknown top-level key " + jquote(m.key);
      const std::string guess = closest(m.key, all);
      const std::string elsewhere = section_of(m.key, "");
      if (!guess.empty()) {
        msg += " (did you mean " + jquote(guess) + "?)";
      } else if (!elsewhere.empty()) {
        msg += " (did you mean " + jquote(elsewhere + "." + m.key) + "?)";
      }
      msg += " is ignored";
      ctx_.warn(m.key_pos, msg);
    }
    if (unknown > kMaxUnknownKeyWarnings)
      ctx_.warn({}, "... and " + std::to_string(unknown - kMaxUnknownKeyWarnings) +
                        " more unknown top-level keys (ignored; only the first " +
                        std::to_string(kMaxUnknownKeyWarnings) + " are listed)");
  }

 private:
  bool known(const std::string& key) const {
    return std::find(supported_.begin(), supported_.end(), key) != supported_.end() ||
           std::find(accepted_.begin(), accepted_.end(), key) != accepted_.end();
  }

  Ctx& ctx_;
  const JsonNode& node_;
  std::string path_;
  std::vector<std::string> supported_, accepted_;
};

// ---------------------------------------------------------------------------------------
// optimizer {type, params}  (DeepSpeed config.py + engine._configure_basic_optimizer)
// ---------------------------------------------------------------------------------------

void read_betas(Section& s, const std::string& key, std::array<double, 2>& betas) {
  const Member* m = s.get(key);
  if (!m) return;
  const std::string expected = "an array of two numbers in [0, 1)";
  if (m->value.kind != K::Array || m->value.items.size() != 2) s.type_error(*m, expected);
  for (size_t i = 0; i < 2; ++i) {
    const JsonNode& b = m->value.items[i];
    if (!b.is_number() || !unit_open().contains(b.as_double())) {
      s.ctx().fail(b.pos.known() ? b.pos : m->key_pos, s.sub(key) + "[" + std::to_string(i) + "]",
                   "expected a number in [0, 1), got " + describe(b));
    }
    betas[i] = b.as_double();
  }
}

// One parameter of a descriptor's schema (ds/config/registry.h), into its field.
template <class P>
void read_param(Section& p, const Param<P>& spec, P& out) {
  std::visit(
      [&](auto field) {
        using F = std::remove_reference_t<decltype(out.*field)>;
        if constexpr (std::is_same_v<F, double>) {
          p.number(spec.key, out.*field, spec.range);
        } else if constexpr (std::is_same_v<F, std::optional<double>>) {
          if (const Member* m = p.get(spec.key)) {
            if (m->value.kind == K::Null) out.*field = std::nullopt;
            else out.*field = p.read_number(*m, spec.range);
          }
        } else if constexpr (std::is_same_v<F, std::int64_t>) {
          p.integer(spec.key, out.*field, spec.min);
        } else if constexpr (std::is_same_v<F, std::optional<std::int64_t>>) {
          if (const Member* m = p.get(spec.key)) {
            if (m->value.kind == K::Null) out.*field = std::nullopt;
            else out.*field = p.read_int(*m, spec.min, kIntMax);
          }
        } else if constexpr (std::is_same_v<F, bool>) {
          if (const Member* m = p.get(spec.key)) {
            const bool v = p.read_bool(*m);
            if (spec.fixed_note.empty()) out.*field = v;
            else if (v != out.*field) p.ctx().warn(m->key_pos, spec.fixed_note);
          }
        } else if constexpr (std::is_same_v<F, std::array<double, 2>>) {
          read_betas(p, spec.key, out.*field);
        } else {
          static_assert(std::is_same_v<F, std::string>);
          if (const Member* m = p.get(spec.key)) {
            const std::string v = p.read_string(*m);
            if (std::find(spec.choices.begin(), spec.choices.end(), v) != spec.choices.end()) {
              out.*field = v;
            } else {  // DeepSpeed prints a note and uses its default
              std::vector<std::string> quoted;
              for (const auto& c : spec.choices) quoted.push_back(jquote(c));
              std::string expected;
              for (size_t i = 0; i < quoted.size(); ++i)
                expected += (i == 0 ? "" : i + 1 == quoted.size() ? " or " : ", ") + quoted[i];
              p.ctx().warn(m->key_pos, p.sub(spec.key) + ": unknown " + spec.key + " " + jquote(v) + " (expected " +
                                           expected + "); using " + jquote(out.*field) + " as DeepSpeed does");
            }
          }
        }
      },
      spec.field);
}

// Whether an optional field is unset (required optional keys are checked after reading).
template <class P>
bool is_optional_unset(const Param<P>& spec, const P& v) {
  return std::visit(
      [&](auto field) {
        using F = std::remove_cvref_t<decltype(v.*field)>;
        if constexpr (std::is_same_v<F, std::optional<double>> || std::is_same_v<F, std::optional<std::int64_t>>) {
          return !(v.*field).has_value();
        } else {
          return false;
        }
      },
      spec.field);
}
template <class P>
bool is_optional(const Param<P>& spec) {
  return spec.field.index() == 1 || spec.field.index() == 3;
}

std::string supported_optimizers() {
  std::vector<std::string> names;
  for (const auto& d : optimizer_registry()) names.push_back(d.display);
  return join(names);
}

const OptimizerDescriptor& find_optimizer_descriptor(Ctx& ctx, const Member& m) {
  const std::string& type = m.value.str;
  const std::string l = lower(type);
  const std::string supported = supported_optimizers();
  // DeepSpeed lower-cases names in its own list; anything else is a case-sensitive
  // torch.optim lookup, so "SGD" works and "sgd" does not.
  for (const auto& d : optimizer_registry()) {
    if (d.torch_name ? type == d.display : l == d.name) return d;
    if (d.torch_name && l == d.name) {
      ctx.fail(m.key_pos, "optimizer.type",
               jquote(type) + " is not a supported optimizer name: DeepSpeed looks " + d.display +
                   " up in torch.optim, case-sensitively; write " + jquote(d.display));
    }
  }
  static const std::vector<std::string> deepspeed_only = {
      "onebitadam", "zerooneadam", "onebitlamb", "lion", "muon", "muadam", "muadamw", "musgd",
      "cpuadam", "fusedadam", "rmsprop", "adamax", "adadelta", "sparseadam", "nadam", "radam", "lbfgs", "asgd", "rprop"};
  if (std::find(deepspeed_only.begin(), deepspeed_only.end(), l) != deepspeed_only.end()) {
    ctx.fail(m.key_pos, "optimizer.type",
             "optimizer " + jquote(type) + " is not supported by dstrain; supported: " + supported);
  }
  std::string msg = "unknown optimizer " + jquote(type);
  std::vector<std::string> displays;
  for (const auto& d : optimizer_registry()) displays.push_back(d.display);
  const std::string guess = closest(type, displays);
  if (!guess.empty()) msg += " (did you mean " + jquote(guess) + "?)";
  ctx.fail(m.key_pos, "optimizer.type", msg + "; supported: " + supported);
}

OptimizerConfig parse_optimizer(Ctx& ctx, const Member& section) {
  Section s(ctx, section.value, section.key_pos, "optimizer");
  s.accept({"legacy_fusion"});
  const std::string supported = supported_optimizers();
  const Member* type = s.get("type");
  if (!type) ctx.fail(section.key_pos, "optimizer", "missing \"type\" (one of " + supported + ")");
  if (type->value.kind != K::String) s.type_error(*type, "an optimizer name (" + supported + ")");

  const OptimizerDescriptor& d = find_optimizer_descriptor(ctx, *type);
  OptimizerConfig o = d.defaults;
  const Member* params = s.get("params");
  if (params && params->value.kind != K::Null) {
    Section p(ctx, params->value, params->key_pos, "optimizer.params");
    if (const Member* mg = p.get("max_grad_norm", false)) {
      ctx.fail(mg->key_pos, "optimizer.params.max_grad_norm",
               "is not accepted here (DeepSpeed raises ValueError): use the top-level \"gradient_clipping\" instead");
    }
    for (const auto& spec : d.params) read_param(p, spec, o);
    for (const auto& key : d.noted) {
      if (const Member* m = p.get(key, false)) {
        p.read_bool(*m);
        DS_INFO(ctx.where(m->key_pos) << ": " << p.sub(key) << " is accepted and ignored: "
                                         "dstrain has one " << d.display << " implementation per device");
      }
    }
    for (const auto& f : d.false_only) p.only_default(f.key, false, f.message);
    for (const auto& key : d.ignored) p.accept({key.c_str()});
    p.finish();
  }
  s.finish();
  return o;
}

// ---------------------------------------------------------------------------------------
// scheduler {type, params}  (DeepSpeed runtime/lr_schedules.py constructors)
// ---------------------------------------------------------------------------------------

SchedulerConfig parse_scheduler(Ctx& ctx, const Member& section) {
  Section s(ctx, section.value, section.key_pos, "scheduler");
  std::vector<std::string> types;
  for (const auto& d : scheduler_registry()) types.push_back(d.name);
  const std::string supported = join(types);
  const Member* type = s.get("type");
  if (!type) ctx.fail(section.key_pos, "scheduler", "missing \"type\" (one of " + supported + ")");
  if (type->value.kind != K::String) s.type_error(*type, "a scheduler name (" + supported + ")");
  const SchedulerDescriptor* d = find_scheduler(type->value.str);
  if (!d) {
    std::string msg = "unknown scheduler " + jquote(type->value.str);
    const std::string guess = closest(type->value.str, types);
    if (!guess.empty()) msg += " (did you mean " + jquote(guess) + "?)";
    ctx.fail(type->key_pos, "scheduler.type", msg + "; supported: " + supported);
  }
  SchedulerConfig c = d->defaults;
  auto missing = [&](SourcePos where, const std::string& key, bool have_params) {
    if (d->required_message.empty()) ctx.fail(where, "scheduler.params." + key, "is required for " + d->name);
    ctx.fail(where, have_params ? "scheduler.params" : "scheduler.params." + key, d->required_message);
  };

  const Member* params = s.get("params");
  if (!params || params->value.kind == K::Null) {
    for (const auto& spec : d->params)
      if (spec.required) missing(section.key_pos, spec.key, false);
    s.finish();
    return c;
  }
  Section p(ctx, params->value, params->key_pos, "scheduler.params");
  if (const Member* m = p.get("last_batch_iteration")) {
    if (p.read_int(*m, std::numeric_limits<std::int64_t>::min(), kIntMax) != -1) {
      ctx.fail(m->key_pos, "scheduler.params.last_batch_iteration",
               "only -1 (a fresh start) is supported: a resumed run restores the scheduler from its checkpoint");
    }
  }
  // Required values first (the optional ones, which may be null, once read).
  for (const auto& spec : d->params) {
    if (spec.required && !is_optional(spec) && !p.get(spec.key)) missing(params->key_pos, spec.key, true);
  }
  for (const auto& spec : d->params) {
    read_param(p, spec, c);
    if (spec.required && is_optional(spec) && is_optional_unset(spec, c)) missing(params->key_pos, spec.key, true);
  }
  if (d->warn) {
    if (auto w = d->warn(c)) ctx.warn(ctx.pos["scheduler.params." + w->first], w->second);
  }
  p.finish();
  s.finish();
  return c;
}

// ---------------------------------------------------------------------------------------
// fp16 / bf16 / zero_optimization / checkpoint / csv_monitor
// ---------------------------------------------------------------------------------------

void parse_fp16(Ctx& ctx, const Member& section, Fp16Config& c) {
  Section s(ctx, section.value, section.key_pos, "fp16");
  s.boolean("enabled", c.enabled);
  s.boolean("auto_cast", c.auto_cast);
  s.number("loss_scale", c.loss_scale, at_least(0));
  s.integer("initial_scale_power", c.initial_scale_power, 0, 127);
  s.integer("loss_scale_window", c.loss_scale_window, 0);
  s.integer("hysteresis", c.hysteresis, 0);
  s.boolean("consecutive_hysteresis", c.consecutive_hysteresis);
  s.number("min_loss_scale", c.min_loss_scale, any_number());
  s.only_default("fp16_master_weights_and_grads", false,
                 "fp16 master weights are not supported: dstrain keeps fp32 master weights");
  s.finish();
}

void parse_bf16(Ctx& ctx, const Member& section, Bf16Config& c) {
  Section s(ctx, section.value, section.key_pos, section.key);
  s.boolean("enabled", c.enabled);
  s.boolean("check_grad_overflow", c.check_grad_overflow);
  if (const Member* m = s.get("immediate_grad_update", false)) s.read_bool(*m);
  s.only_default("bf16_master_weights_and_grads", false,
                 "bf16 master weights are not supported: dstrain keeps fp32 master weights");
  s.only_default("bf16_optimizer_states", false,
                 "bf16 optimizer states are not supported: dstrain keeps fp32 optimizer states");
  s.finish();
}

void check_offload(Section& s, const std::string& key) {
  const Member* m = s.get(key, false);
  if (!m || m->value.kind == K::Null) return;
  Section o(s.ctx(), m->value, m->key_pos, s.sub(key));
  if (const Member* d = o.get("device")) {
    const std::string dev = lower(o.read_string(*d));
    if (dev != "none" && dev != "cpu" && dev != "nvme") o.type_error(*d, "\"none\", \"cpu\" or \"nvme\"");
    if (dev != "none") {
      s.ctx().fail(d->key_pos, o.sub("device"),
                   "offloading is not supported by dstrain; remove " + key + " or set its device to \"none\"");
    }
  }
  o.accept({"nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory", "pipeline_read",
            "pipeline_write", "fast_init", "ratio", "super_offload", "cpuadam_cores_perc", "pipeline"});
  o.finish();
}

void parse_zero(Ctx& ctx, const Member& section, ZeroConfig& c) {
  if (section.value.kind == K::Bool) {
    // Deprecated bool form: true is stage 1 with allgather_bucket_size from "allgather_size".
    c.stage = section.value.boolean ? 1 : 0;
    ctx.warn(section.key_pos, std::string("\"zero_optimization\": ") + (section.value.boolean ? "true" : "false") +
                                  " is deprecated; write {\"stage\": " + std::to_string(c.stage) + "}");
    return;
  }
  Section s(ctx, section.value, section.key_pos, "zero_optimization");
  if (const Member* m = s.get("stage")) {
    const std::int64_t st = s.read_int(*m, 0, 3);
    if (st == 3) {
      ctx.fail(m->key_pos, "zero_optimization.stage",
               "ZeRO stage 3 is not supported by dstrain; only stages 0, 1 and 2 are supported");
    }
    c.stage = static_cast<int>(st);
  }
  // Keys whose DeepSpeed alternatives dstrain does not implement: dstrain always does what
  // the default value means, so the other value is read, kept, and warned about once.
  auto fixed_behaviour = [&](const char* key, bool& out, bool dstrain_value, const std::string& what) {
    const Member* m = s.get(key);
    if (!m) return;
    out = s.read_bool(*m);
    if (out != dstrain_value) {
      ctx.warn(m->key_pos, s.sub(key) + " " + (out ? "true" : "false") + " has no effect: " + what);
    }
  };
  fixed_behaviour("contiguous_gradients", c.contiguous_gradients, true,
                  "dstrain always keeps gradients in one contiguous flat buffer");
  // reduce_scatter: both values match what dstrain does (docs/user/config.md); it feeds the
  // stage-2 cross-key check below.
  s.boolean("reduce_scatter", c.reduce_scatter);
  s.integer("reduce_bucket_size", c.reduce_bucket_size, 1);
  if (const Member* m = s.get("allgather_bucket_size")) {
    c.allgather_bucket_size = s.read_int(*m, 2, kIntMax);
    if (c.allgather_bucket_size % 2 != 0) s.type_error(*m, "an even integer (DeepSpeed asserts a multiple of 2)");
  }
  fixed_behaviour("allgather_partitions", c.allgather_partitions, true,
                  "dstrain always all-gathers the updated partitions (no per-rank broadcasts)");
  if (const Member* m = s.get("overlap_comm")) {
    if (m->value.kind == K::Null) {
      c.overlap_comm.reset();
    } else {
      c.overlap_comm = s.read_bool(*m);
      if (!*c.overlap_comm) {
        ctx.warn(m->key_pos, s.sub("overlap_comm") + " false has no effect: dstrain always overlaps the "
                             "gradient reduction with the backward pass");
      }
    }
  }
  check_offload(s, "offload_optimizer");
  check_offload(s, "offload_param");
  s.only_default("cpu_offload", false, "offloading is not supported by dstrain; remove cpu_offload");
  s.only_default("cpu_offload_param", false, "offloading is not supported by dstrain; remove cpu_offload_param");
  s.only_default("legacy_stage1", false, "legacy_stage1 was removed from DeepSpeed and is not supported");
  s.accept({"cpu_offload_use_pin_memory", "use_multi_rank_bucket_allreduce", "load_from_fp32_weights",
            "elastic_checkpoint", "sub_group_size", "ignore_unused_parameters", "round_robin_gradients",
            "zero_hpz_partition_size", "zero_quantized_weights", "zero_quantized_nontrainable_weights",
            "zero_quantized_gradients", "memory_efficient_linear", "mics_shard_size",
            "mics_hierarchical_params_gather", "pipeline_loading_checkpoint", "log_trace_cache_warnings",
            "leaf_module", "override_module_apply", "zeropp_loco_param",
            // stage-3 keys, under both their stage3_ and bare names (populate_by_name)
            "stage3_prefetch_bucket_size", "prefetch_bucket_size", "stage3_param_persistence_threshold",
            "param_persistence_threshold", "stage3_model_persistence_threshold", "model_persistence_threshold",
            "stage3_max_live_parameters", "max_live_parameters", "stage3_max_reuse_distance",
            "max_reuse_distance", "stage3_gather_16bit_weights_on_model_save",
            "gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
            "stage3_module_granularity_threshold", "module_granularity_threshold",
            "stage3_use_all_reduce_for_fetch_params", "use_all_reduce_for_fetch_params",
            "stage3_allgather_sequential", "allgather_sequential"});
  s.finish();
}

void parse_data_types(Ctx& ctx, const Member& section, DataTypesConfig& c) {
  Section s(ctx, section.value, section.key_pos, "data_types");
  if (const Member* m = s.get("grad_accum_dtype"); m && m->value.kind != K::Null) {
    const std::string expected = "\"fp32\", \"fp16\" or \"bf16\"";
    if (m->value.kind != K::String) s.type_error(*m, expected);
    const std::string v = lower(m->value.str);
    if (v != "fp32" && v != "fp16" && v != "bf16") s.type_error(*m, expected);
    c.grad_accum_dtype = v;
  }
  // DeepSpeed reads these too; dstrain's parameters follow fp16/bf16.enabled.
  s.accept({"param_dtype", "buffer_dtype"});
  s.finish();
}

void parse_checkpoint(Ctx& ctx, const Member& section, CheckpointConfig& c) {
  Section s(ctx, section.value, section.key_pos, "checkpoint");
  if (const Member* m = s.get("tag_validation")) {
    const std::string v = lower(s.read_string(*m));
    if (v == "ignore") c.tag_validation = "Ignore";
    else if (v == "warn") c.tag_validation = "Warn";
    else if (v == "fail") c.tag_validation = "Fail";
    else s.type_error(*m, "\"Ignore\", \"Warn\" or \"Fail\"");
  }
  s.boolean("async_save", c.async_save);
  s.integer("io_threads", c.io_threads, 0, 64);
  s.accept({"load_universal", "use_node_local_storage", "parallel_write", "checkpoint_serialization", "writer"});
  s.finish();
}

void parse_csv_monitor(Ctx& ctx, const Member& section, CsvMonitorConfig& c) {
  Section s(ctx, section.value, section.key_pos, "csv_monitor");
  s.boolean("enabled", c.enabled);
  s.string("output_path", c.output_path);
  s.string("job_name", c.job_name);
  s.finish();
}

void parse_comms_config(Ctx& ctx, const Member& section, CommsConfig& c) {
  Section s(ctx, section.value, section.key_pos, "comms_config");
  s.number("timeout", c.timeout, Range{0, 1e9});
  s.finish();
}

// dstrain extensions: the knobs that were environment variables.
void parse_communication(Ctx& ctx, const Member& section, CommunicationConfig& c) {
  Section s(ctx, section.value, section.key_pos, "communication");
  s.boolean("shared_memory", c.shared_memory);
  s.boolean("progress_thread", c.progress_thread);
  s.finish();
}

// One of `choices` (case-insensitive), stored as written in the list.
void choice(Section& s, const std::string& key, std::string& out, const std::vector<std::string>& choices) {
  const Member* m = s.get(key);
  if (!m) return;
  std::string expected;
  for (size_t i = 0; i < choices.size(); ++i) {
    expected += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + jquote(choices[i]);
  }
  if (m->value.kind != K::String) s.type_error(*m, expected);
  const std::string v = lower(m->value.str);
  if (std::find(choices.begin(), choices.end(), v) == choices.end()) s.type_error(*m, expected);
  out = v;
}

void parse_kernels(Ctx& ctx, const Member& section, KernelsConfig& c) {
  Section s(ctx, section.value, section.key_pos, "kernels");
  choice(s, "attention", c.attention, {"auto", "materialized", "flash"});
  s.integer("attention_block", c.attention_block, 1);
  choice(s, "cpu_bf16_gemm", c.cpu_bf16_gemm, {"auto", "on", "off"});
  s.finish();
}

// ---------------------------------------------------------------------------------------
// The document
// ---------------------------------------------------------------------------------------

DsConfig parse_root(const JsonNode& root, const std::string& source, std::vector<std::string>* warnings,
                    std::vector<std::string>* keys = nullptr) {
  Ctx ctx;
  ctx.keys = keys;
  ctx.source = source;
  ctx.warnings = warnings;
  if (root.kind != K::Object) ctx.fail(root.pos, "", "a config must be a JSON object, got " + describe(root));

  DsConfig cfg;
  cfg.source = source;
  cfg.raw = to_nlohmann(root);
  Section top(ctx, root, {}, "");

  // Batch sizes: "auto" or null mean "not given" (HF-style configs write "auto").
  auto batch = [&](const char* key, std::int64_t& out) {
    if (const Member* m = top.get(key)) {
      if (m->value.kind != K::Null) out = top.read_int(*m, 1, kIntMax);
    }
  };
  batch("train_batch_size", cfg.train_batch_size);
  batch("train_micro_batch_size_per_gpu", cfg.train_micro_batch_size_per_gpu);
  batch("gradient_accumulation_steps", cfg.gradient_accumulation_steps);

  if (const Member* m = top.get("optimizer"); m && m->value.kind != K::Null) cfg.optimizer = parse_optimizer(ctx, *m);
  if (const Member* m = top.get("scheduler"); m && m->value.kind != K::Null) cfg.scheduler = parse_scheduler(ctx, *m);
  if (const Member* m = top.get("fp16")) parse_fp16(ctx, *m, cfg.fp16);

  // "bf16", or its legacy name "bfloat16" when "bf16" is absent.
  const Member* bf16 = top.get("bf16");
  const Member* bfloat16 = top.get("bfloat16");
  if (bf16 && bfloat16) {
    ctx.warn(bfloat16->key_pos, "\"bfloat16\" is ignored because \"bf16\" is also given (DeepSpeed uses \"bf16\")");
  }
  if (bf16) {
    parse_bf16(ctx, *bf16, cfg.bf16);
  } else if (bfloat16) {
    parse_bf16(ctx, *bfloat16, cfg.bf16);
  }

  if (const Member* m = top.get("zero_optimization")) parse_zero(ctx, *m, cfg.zero_optimization);
  if (const Member* m = top.get("allgather_size")) {
    const std::int64_t v = top.read_int(*m, 2, kIntMax);
    if (v % 2 != 0) top.type_error(*m, "an even integer");
    const Member* z = root.find("zero_optimization");
    if (z && z->value.kind == K::Bool) cfg.zero_optimization.allgather_bucket_size = v;
  }

  top.number("gradient_clipping", cfg.gradient_clipping, at_least(0));
  if (const Member* m = top.get("steps_per_print")) {
    if (m->value.kind == K::Null) cfg.steps_per_print.reset();
    else cfg.steps_per_print = top.read_int(*m, 1, kIntMax);
  }
  top.boolean("wall_clock_breakdown", cfg.wall_clock_breakdown);
  top.boolean("prescale_gradients", cfg.prescale_gradients);
  top.number("gradient_predivide_factor", cfg.gradient_predivide_factor, above(0));
  if (const Member* m = top.get("communication_data_type"); m && m->value.kind != K::Null) {
    if (m->value.kind != K::String) top.type_error(*m, "\"fp32\", \"fp16\" or \"bf16\"");
    const std::string v = lower(m->value.str);
    if (v != "fp32" && v != "fp16" && v != "bf16") top.type_error(*m, "\"fp32\", \"fp16\" or \"bf16\"");
    cfg.communication_data_type = v;
  }
  top.boolean("dataloader_drop_last", cfg.dataloader_drop_last);
  if (const Member* m = top.get("data_types"); m && m->value.kind != K::Null) parse_data_types(ctx, *m, cfg.data_types);
  if (const Member* m = top.get("checkpoint"); m && m->value.kind != K::Null) parse_checkpoint(ctx, *m, cfg.checkpoint);
  if (const Member* m = top.get("csv_monitor"); m && m->value.kind != K::Null) parse_csv_monitor(ctx, *m, cfg.csv_monitor);
  if (const Member* m = top.get("comms_config"); m && m->value.kind != K::Null)
    parse_comms_config(ctx, *m, cfg.comms_config);
  if (const Member* m = top.get("communication"); m && m->value.kind != K::Null)
    parse_communication(ctx, *m, cfg.communication);
  if (const Member* m = top.get("kernels"); m && m->value.kind != K::Null) parse_kernels(ctx, *m, cfg.kernels);
  if (const Member* m = top.get("seed"); m && m->value.kind != K::Null) {
    if (m->value.kind == K::UInt) cfg.seed = m->value.uint_value;
    else cfg.seed = static_cast<std::uint64_t>(top.read_int(*m, 0, kIntMax));
  }
  top.get("model");  // the train app's model section; kept in raw

  // DeepSpeed keys whose non-default value changes behaviour we do not implement.
  if (const Member* m = top.get("amp", false); m && m->value.kind != K::Null) {
    Section a(ctx, m->value, m->key_pos, "amp");
    a.only_default("enabled", false, "Apex AMP is not supported; use fp16 or bf16");
    a.accept({"opt_level", "cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32",
              "master_weights", "loss_scale", "min_loss_scale", "max_loss_scale"});
    a.finish();
  }
  if (const Member* m = top.get("elasticity", false); m && m->value.kind == K::Object) {
    if (const Member* e = m->value.find("enabled"); e && e->value.kind == K::Bool && e->value.boolean) {
      ctx.fail(e->key_pos, "elasticity.enabled", "elastic training is not supported by dstrain");
    }
  }
  if (const Member* m = top.get("sequence_parallel_size", false)) {
    if (top.read_int(*m, 1, kIntMax) != 1) top.type_error(*m, "1 (sequence parallelism is not supported)");
  }
  if (const Member* m = top.get("gradient_allreduce_op", false)) {
    if (m->value.kind != K::String || lower(m->value.str) != "mean") {
      top.type_error(*m, "\"mean\" (dstrain always averages gradients)");
    }
  }
  if (const Member* m = top.get("managed_gradient_accumulation", false)) {
    if (!top.read_bool(*m)) {
      ctx.fail(m->key_pos, "managed_gradient_accumulation", "false is not supported: dstrain owns the accumulation boundary");
    }
  }
  // DeepSpeed top-level keys accepted with no effect (docs/user/config.md).
  top.accept({"memory_breakdown", "dump_state", "sparse_gradients", "disable_allgather",
              "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "activation_checkpointing",
              "flops_profiler", "tensorboard", "wandb", "comet", "comms_logger", "timers",
              "log_level", "vocabulary_size", "torch_autocast", "autotuning", "compression_training",
              "data_efficiency", "curriculum_learning", "aio", "sparse_attention", "hybrid_engine", "compile",
              "eigenvalue", "progressive_layer_drop", "quantize_training", "nebula", "pipeline",
              "weight_quantization", "graph_harvesting", "use_data_before_expert_parallelism",
              "fp32_allreduce", "monitor_config"});
  top.finish_top_level();

  // The rules across keys (validate.cpp), with the positions read here.
  detail::validate_parsed(cfg, ctx.pos);
  return cfg;
}

// Something exists at `path` (of any kind: a directory or FIFO is then reported as what it is
// by load_config_file, not as "no such file").
bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// URL-safe (or standard) base64, padding optional, trailing white space ignored; nullopt
// when it is not base64 or decodes to nothing.
std::optional<std::string> base64_decode(std::string_view in) {
  while (!in.empty() && std::isspace(static_cast<unsigned char>(in.back()))) in.remove_suffix(1);
  std::optional<std::string> out = try_base64_decode(in);
  if (!out || out->empty()) return std::nullopt;
  return out;
}

}  // namespace

DsConfig parse_config_text(const std::string& text, const std::string& source, std::vector<std::string>* warnings) {
  // Parsing costs many times the text's size, on every rank: refuse what no config needs.
  DS_CHECK(text.size() <= kMaxConfigBytes, "config " << source << " is " << text.size() << " bytes; the limit is "
                                                     << kMaxConfigBytes << " bytes (" << (kMaxConfigBytes >> 20) << " MiB)");
  return parse_root(parse_json(text, source), source, warnings);
}

DsConfig parse_config_json(const nlohmann::json& doc, const std::string& source, std::vector<std::string>* warnings) {
  return parse_root(from_nlohmann(doc), source, warnings);
}

DsConfig load_config_file(const std::string& path, std::vector<std::string>* warnings) {
  return parse_config_text(read_regular_file(path, "config file", kMaxConfigBytes), path, warnings);
}

DsConfig load_config(const std::string& path_or_json, std::vector<std::string>* warnings) {
  if (path_exists(path_or_json)) return load_config_file(path_or_json, warnings);
  const size_t first = path_or_json.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && path_or_json[first] == '{') {
    return parse_config_text(path_or_json, "<json string>", warnings);
  }
  if (auto decoded = base64_decode(path_or_json)) {
    const size_t f = decoded->find_first_not_of(" \t\r\n");
    if (f != std::string::npos && (*decoded)[f] == '{') {
      return parse_config_text(*decoded, "<base64 config>", warnings);
    }
  }
  std::string shown = path_or_json.size() > 80 ? path_or_json.substr(0, 80) + "..." : path_or_json;
  DS_THROW("config " << jquote(shown) << " is neither an existing file, nor JSON text, nor base64-encoded JSON"
                     << (path_or_json.find('/') != std::string::npos || path_or_json.ends_with(".json")
                             ? " (no such file)"
                             : ""));
}

std::vector<std::string> config_keys() {
  // Each section registers its keys as it is read, given or not: read a document with every
  // section present, and one optimizer and scheduler section per descriptor.
  std::vector<std::string> keys;
  nlohmann::json doc = nlohmann::json::object();
  for (const char* section : {"fp16", "bf16", "bfloat16", "data_types", "checkpoint", "csv_monitor", "comms_config",
                              "communication", "kernels", "amp"})
    doc[section] = nlohmann::json::object();
  doc["zero_optimization"] = {{"offload_optimizer", nlohmann::json::object()},
                              {"offload_param", nlohmann::json::object()}};
  parse_root(from_nlohmann(doc), "<keys>", nullptr, &keys);
  keys.push_back("elasticity.enabled");  // checked without a section reader (only false)
  for (const auto& d : optimizer_registry()) {
    const nlohmann::json o = {{"optimizer", {{"type", d.display}, {"params", nlohmann::json::object()}}}};
    parse_root(from_nlohmann(o), "<keys>", nullptr, &keys);
  }
  for (const auto& d : scheduler_registry()) {
    nlohmann::json params = nlohmann::json::object();
    for (const auto& spec : d.params)
      if (spec.required) params[spec.key] = 1e6;  // any valid value
    const nlohmann::json o = {{"scheduler", {{"type", d.name}, {"params", params}}}};
    parse_root(from_nlohmann(o), "<keys>", nullptr, &keys);
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  return keys;
}

}  // namespace ds::config
