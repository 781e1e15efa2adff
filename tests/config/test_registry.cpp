// The optimizer and scheduler descriptors (ds/config/registry.h): every parameter of every
// descriptor is read by the parser and written back by to_json, at its default and at
// another valid value, and the written config reads back to the same config.
#include <gtest/gtest.h>

#include <string>
#include <type_traits>
#include <variant>

#include "ds/config/parse.h"
#include "ds/config/registry.h"
#include "ds/core/error.h"

namespace {

using namespace ds::config;
using nlohmann::json;

// A valid value other than the default (nullopt when the parameter has none to offer).
template <class P>
std::optional<json> other_value(const Param<P>& spec, const P& defaults) {
  return std::visit(
      [&](auto field) -> std::optional<json> {
        using F = std::remove_cvref_t<decltype(defaults.*field)>;
        if constexpr (std::is_same_v<F, double> || std::is_same_v<F, std::optional<double>>) {
          const std::optional<double> def = defaults.*field;
          for (double v : {0.5, 0.25, 2.0, 0.0, 3.0}) {
            if (spec.range.contains(v) && def != v) return json(v);
          }
          return std::nullopt;
        } else if constexpr (std::is_same_v<F, std::int64_t> || std::is_same_v<F, std::optional<std::int64_t>>) {
          return json(spec.min + 3000);
        } else if constexpr (std::is_same_v<F, bool>) {
          if (!spec.fixed_note.empty()) return std::nullopt;
          return json(!(defaults.*field));
        } else if constexpr (std::is_same_v<F, std::array<double, 2>>) {
          return json{0.8, 0.95};
        } else {
          return spec.choices.empty() ? std::nullopt : std::optional<json>(json(spec.choices.back()));
        }
      },
      spec.field);
}

template <class F>
void set_from(F& out, const json& v) {
  if constexpr (std::is_same_v<F, std::optional<double>>) out = v.get<double>();
  else if constexpr (std::is_same_v<F, std::optional<std::int64_t>>) out = v.get<std::int64_t>();
  else out = v.get<F>();
}

// parse -> to_json -> parse -> to_json gives the same resolved JSON; returns the first.
json round_trip(const json& doc) {
  std::vector<std::string> warnings;
  const DsConfig c = parse_config_json(doc, "<registry test>", &warnings);
  EXPECT_TRUE(warnings.empty()) << doc.dump() << ": " << warnings.front();
  const json j = to_json(c);
  const DsConfig again = parse_config_text(j.dump(2), "resolved.json");
  EXPECT_EQ(to_json(again), j) << doc.dump();
  return j;
}

TEST(ConfigRegistry, EveryOptimizerParamRoundTrips) {
  ASSERT_EQ(optimizer_registry().size(), 5u);
  for (const auto& d : optimizer_registry()) {
    SCOPED_TRACE(d.name);
    EXPECT_EQ(find_optimizer(d.name), &d);
    EXPECT_EQ(d.defaults.type, d.name);
    // Defaults: every key is written, with the descriptor's default.
    const json base = round_trip({{"optimizer", {{"type", d.display}}}});
    EXPECT_EQ(base["optimizer"]["type"], d.display);
    EXPECT_EQ(base["optimizer"]["params"].size(), d.params.size());
    for (const auto& spec : d.params) {
      SCOPED_TRACE(spec.key);
      ASSERT_TRUE(base["optimizer"]["params"].contains(spec.key));
      const auto v = other_value(spec, d.defaults);
      if (!v) continue;
      ds::optim::OptimizerParams p = d.defaults;  // a rule across params may refuse the value alone
      std::visit([&](auto field) { set_from(p.*field, *v); }, spec.field);
      if (d.check && d.check(p)) continue;
      const json j = round_trip({{"optimizer", {{"type", d.display}, {"params", {{spec.key, *v}}}}}});
      EXPECT_EQ(j["optimizer"]["params"][spec.key], *v);
    }
  }
}

TEST(ConfigRegistry, EverySchedulerParamRoundTrips) {
  ASSERT_EQ(scheduler_registry().size(), 5u);
  for (const auto& d : scheduler_registry()) {
    SCOPED_TRACE(d.name);
    EXPECT_EQ(find_scheduler(d.name), &d);
    json required = json::object();
    for (const auto& spec : d.params)
      if (spec.required) required[spec.key] = 5000;
    const json doc = {{"optimizer", {{"type", "Adam"}}}, {"scheduler", {{"type", d.name}, {"params", required}}}};
    const json base = round_trip(doc);
    EXPECT_EQ(base["scheduler"]["params"].size(), d.params.size());
    for (const auto& spec : d.params) {
      SCOPED_TRACE(spec.key);
      ASSERT_TRUE(base["scheduler"]["params"].contains(spec.key));
      EXPECT_FALSE(base["scheduler"]["params"][spec.key].is_null());  // unset values show what they mean
      const auto v = other_value(spec, d.defaults);
      if (!v) continue;
      json d2 = doc;
      d2["scheduler"]["params"][spec.key] = *v;
      const json j = round_trip(d2);
      EXPECT_EQ(j["scheduler"]["params"][spec.key], *v);
    }
  }
}

// What a descriptor says about restrictions is what the rules apply.
TEST(ConfigRegistry, RestrictionsComeFromTheDescriptor) {
  for (const auto& d : optimizer_registry()) {
    DsConfig c;
    c.source = "<code>";
    c.optimizer = d.defaults;
    c.fp16.enabled = true;
    c.fp16.loss_scale = 128;
    bool threw = false;
    try {
      parse_config_json(to_json(c), "<code>");
    } catch (const ds::Error&) {
      threw = true;
    }
    EXPECT_EQ(threw, !d.needs_dynamic_loss_scale.empty()) << d.name;
  }
}

}  // namespace
