// The parser's machinery, shared by its files (internal to ds_config): where keys were
// written (Ctx), and the reader of one JSON object of the config (Section) whose typed
// getters mark keys as known and whose finish() rejects the rest with a suggestion.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "ds/core/json.h"
#include "ds/config/parse.h"
#include "ds/config/registry.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "validate_parsed.h"

namespace ds::config::detail {

using K = JsonNode::Kind;
using Member = JsonNode::Member;
constexpr std::int64_t kIntMax = std::numeric_limits<std::int64_t>::max();

std::string lower(std::string s);
// The closest candidate if it is close enough to be a plausible typo, else "".
std::string closest(const std::string& key, const std::vector<std::string>& candidates);
std::string jquote(const std::string& s);
std::string join(const std::vector<std::string>& v, const char* sep = ", ");
// The section (other than `except`) that has `key`, or "" (schema.cpp).
std::string section_of(const std::string& key, const std::string& except);

struct Ctx {
  std::string source;
  std::vector<std::string>* warnings = nullptr;
  std::vector<AutoValue>* autos = nullptr;  // the "auto" values met, for fill_auto_values()
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

inline Range any_number() { return Range::any(); }
inline Range at_least(double v) { return Range::at_least(v); }
inline Range above(double v) { return Range::above(v); }
inline Range unit_open() { return Range::unit_open(); }

inline bool is_auto(const JsonNode& n) { return n.kind == K::String && n.str == "auto"; }

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

  // The member for key, or nullptr when absent or "auto". An "auto" (the Hugging Face
  // Trainer's placeholder) is recorded in ctx.autos: fill_auto_values() fills it from what
  // the job knows, or refuses it, and reports either way. Marks the key as known and
  // remembers its position.
  const Member* get(const std::string& key, bool supported = true) {
    const Member* m = get_raw(key, supported);
    if (m && is_auto(m->value)) {
      if (ctx_.autos) ctx_.autos->push_back({sub(key), ctx_.where(m->key_pos)});
      return nullptr;
    }
    return m;
  }
  // The same, with "auto" returned as written: for keys where "auto" is one of dstrain's own
  // choices (kernels.attention, communication.device_backend).
  const Member* get_raw(const std::string& key, bool supported = true) {
    (supported ? supported_ : accepted_).push_back(key);
    if (ctx_.keys) ctx_.keys->push_back(sub(key));
    const Member* m = node_.find(key);
    if (!m) return nullptr;
    ctx_.pos[sub(key)] = m->key_pos;
    return m;
  }
  // Whether key is written as "auto".
  bool is_auto_value(const std::string& key) const {
    const Member* m = node_.find(key);
    return m != nullptr && is_auto(m->value);
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

  static std::vector<std::string> sorted_unique(std::vector<std::string> keys) {
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    return keys;
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
      msg += "; supported keys: " + join(sorted_unique(supported_));
      // The DeepSpeed keys this section also takes (no effect, or only at their default).
      std::vector<std::string> also;
      for (const std::string& k : sorted_unique(accepted_))
        if (std::find(supported_.begin(), supported_.end(), k) == supported_.end()) also.push_back(k);
      if (!also.empty()) msg += "; also accepted (no effect, or only at their default): " + join(also);
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

// One function per section (sections.cpp; optimizer and scheduler: section_params.cpp).
OptimizerConfig parse_optimizer(Ctx& ctx, const Member& section);
SchedulerConfig parse_scheduler(Ctx& ctx, const Member& section);
void parse_fp16(Ctx& ctx, const Member& section, Fp16Config& c);
void parse_bf16(Ctx& ctx, const Member& section, Bf16Config& c);
void parse_zero(Ctx& ctx, const Member& section, ZeroConfig& c);
// zero_optimization's offload_optimizer / offload_param / cpu_offload / cpu_offload_param,
// and the aio section (offload.cpp).
void parse_offload_sections(Section& zero, ZeroConfig& c);
void parse_aio(Ctx& ctx, const Member& section, AioConfig& c);
void parse_data_types(Ctx& ctx, const Member& section, DataTypesConfig& c);
void parse_checkpoint(Ctx& ctx, const Member& section, CheckpointConfig& c);
void parse_monitor(Ctx& ctx, const Member& section, MonitorConfig& c);  // csv_monitor, tensorboard
void parse_comms_config(Ctx& ctx, const Member& section, CommsConfig& c);
// DeepSpeed features dstrain does not implement (features.cpp): enabled, an error when they
// change what is trained, a warning when they only observe.
void check_features(Ctx& ctx, Section& top);
void check_zero_features(Section& zero_optimization);
void parse_communication(Ctx& ctx, const Member& section, CommunicationConfig& c, CommsConfig& timeout);
void parse_comms_logger(Ctx& ctx, const Member& section, CommsLoggerConfig& c);
void parse_kernels(Ctx& ctx, const Member& section, KernelsConfig& c);
void parse_activation_checkpointing(Ctx& ctx, const Member& section, ActivationCheckpointingConfig& c);
void parse_pipeline(Ctx& ctx, const Member& section, PipelineConfig& c);  // pipeline.cpp
void parse_flops_profiler(Ctx& ctx, const Member& section, FlopsProfilerConfig& c);

// The whole document (loaders.cpp). keys: config_keys() collects every key path read.
DsConfig parse_root(const JsonNode& root, const std::string& source, std::vector<std::string>* warnings,
                    std::vector<std::string>* keys = nullptr);

}  // namespace ds::config::detail
