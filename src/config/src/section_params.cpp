// The optimizer and scheduler sections, read through their descriptors
// (ds/config/registry.h): the schema of each says which keys `params` has, their types,
// defaults and ranges.
#include <type_traits>
#include <variant>

#include "reader.h"

namespace ds::config::detail {

namespace {

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

}  // namespace

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
    for (const auto& [key, note] : d.noted) {
      if (const Member* m = p.get(key, false)) {
        p.read_bool(*m);
        DS_INFO(ctx.where(m->key_pos) << ": " << p.sub(key) << " " << note);
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
    if (spec.required && !is_optional(spec) && !p.get(spec.key) && !p.is_auto_value(spec.key))
      missing(params->key_pos, spec.key, true);
  }
  // A required value written "auto" is filled (or refused) by fill_auto_values().
  for (const auto& spec : d->params) {
    read_param(p, spec, c);
    if (spec.required && is_optional(spec) && is_optional_unset(spec, c) && !p.is_auto_value(spec.key))
      missing(params->key_pos, spec.key, true);
  }
  if (d->warn) {
    if (auto w = d->warn(c)) ctx.warn(ctx.pos["scheduler.params." + w->first], w->second);
  }
  p.finish();
  s.finish();
  return c;
}

}  // namespace ds::config::detail
