#include "client_state_check.h"

#include <cstdio>

#include "ds/core/error.h"
#include "ds/core/file_read.h"

namespace ds::train {

namespace {

constexpr std::int64_t kMaxSteps = std::int64_t(1) << 40;  // --steps' limit

std::int64_t int_field(const io::StateValue& m, const char* key, const std::string& field, std::int64_t lo,
                       std::int64_t hi, const std::string& dir) {
  DS_CHECK(m.contains(key), "checkpoint " << dir << ": client state has no '" << field << "' (not saved by train?)");
  const io::StateValue& v = m.at(key);
  DS_CHECK(v.is_int(), "checkpoint " << dir << ": client state '" << field << "' is not an integer");
  const std::int64_t x = v.as_int();
  DS_CHECK(x >= lo && x <= hi, "checkpoint " << dir << ": client state '" << field << "' is " << x
                                             << "; expected an integer in [" << lo << ", " << hi << "]");
  return x;
}

std::string fingerprint_text(std::uint64_t h) {
  char b[32];
  std::snprintf(b, sizeof b, "fnv1a64:%016llx", static_cast<unsigned long long>(h));
  return b;
}

std::string describe(const std::string& source, std::int64_t count, const std::string& unit,
                     const std::string& fingerprint) {
  return "'" + source + "' (" + std::to_string(count) + " " + unit + ", " + fingerprint + ")";
}

}  // namespace

io::StateValue data_identity_state(const DataIdentity& data) {
  io::StateValue v;
  v["source"] = data.source;
  v["tokens"] = data.tokens;
  v["fingerprint"] = fingerprint_text(data.fingerprint);
  v["unit"] = data.unit;
  return v;
}

std::string data_change_warning(const io::StateValue& cs, const std::string& dir, const DataIdentity& here) {
  if (!cs.is_map() || !cs.contains("data")) return "";
  const io::StateValue& d = cs.at("data");
  const bool readable = d.is_map() && d.contains("source") && d.at("source").is_string() && d.contains("tokens") &&
                        d.at("tokens").is_int() && d.contains("fingerprint") && d.at("fingerprint").is_string();
  const std::string this_run = describe(here.source, here.tokens, here.unit, fingerprint_text(here.fingerprint));
  if (!readable)
    return "checkpoint " + dir + ": client state 'data' is not readable; cannot tell whether this run's data " +
           this_run + " is what it was trained on";
  const std::string there = d.at("fingerprint").as_string();
  const std::string unit = d.contains("unit") && d.at("unit").is_string() ? d.at("unit").as_string() : "tokens";
  if (d.at("tokens").as_int() == here.tokens && unit == here.unit && there == fingerprint_text(here.fingerprint))
    return "";
  return "checkpoint " + dir + " was trained on " +
         describe(printable_excerpt(d.at("source").as_string(), 256), d.at("tokens").as_int(),
                  printable_excerpt(unit, 16), printable_excerpt(there)) +
         "; this run trains on " + this_run + ": the data position continues from the checkpoint's, in other data";
}

std::uint64_t rescaled_sampler_step(std::int64_t step, std::int64_t saved_global_micro_batch,
                                    std::int64_t global_micro_batch) {
  if (saved_global_micro_batch == global_micro_batch) return std::uint64_t(step);
  // step <= 2^40 and a micro-batch <= 2^31: the product needs more than 64 bits.
  const unsigned __int128 p = static_cast<unsigned __int128>(step) * static_cast<unsigned __int128>(saved_global_micro_batch);
  return std::uint64_t(p / static_cast<unsigned __int128>(global_micro_batch));
}

void check_client_state(const io::StateValue& cs, const std::string& dir, const ResumeExpect& expect) {
  DS_CHECK(cs.is_map(), "checkpoint " << dir << ": client state is not a map (not saved by train)");
  (void)int_field(cs, "step", "step", 0, kMaxSteps, dir);
  if (cs.contains("model")) {
    const io::StateValue& m = cs.at("model");
    DS_CHECK(m.is_string(), "checkpoint " << dir << ": client state 'model' is not a string");
    DS_CHECK(m.as_string() == expect.model, "checkpoint " << dir << " was saved from the model '" << m.as_string()
                                                          << "'; this run builds '" << expect.model
                                                          << "': resume with the same model flags and config");
  }
  if (cs.contains("sampler")) {
    const io::StateValue& s = cs.at("sampler");
    DS_CHECK(s.is_map(), "checkpoint " << dir << ": client state 'sampler' is not a map");
    (void)int_field(s, "epoch", "sampler.epoch", 0, std::int64_t(1) << 32, dir);
    const std::int64_t step = int_field(s, "step", "sampler.step", 0, kMaxSteps, dir);
    std::int64_t there = expect.global_micro_batch;
    if (s.contains("global_micro_batch"))
      there = int_field(s, "global_micro_batch", "sampler.global_micro_batch", 1, std::int64_t(1) << 31, dir);
    const std::uint64_t here_step = rescaled_sampler_step(step, there, expect.global_micro_batch);
    DS_CHECK(here_step <= expect.steps_per_epoch,
             "checkpoint " << dir << ": client state 'sampler.step' is " << step << " (" << here_step
                           << " micro-batches of this run), beyond the " << expect.steps_per_epoch
                           << " micro-batches of an epoch");
  }
  if (cs.contains("rng"))
    DS_CHECK(cs.at("rng").is_string(), "checkpoint " << dir << ": client state 'rng' is not a string");
}

}  // namespace ds::train
