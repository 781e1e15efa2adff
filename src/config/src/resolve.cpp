// Batch-size resolution exactly as DeepSpeed's DeepSpeedConfig._set_batch_related_parameters
// and _batch_assertion (DeepSpeed's runtime/config.py), with errors that show
// all four numbers and say what to change.
#include <sstream>
#include <string>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/error.h"

namespace ds::config {

namespace {

using i64 = std::int64_t;

// Up to `limit` divisors of n, largest first, skipping `skip`. The largest are n / d for the
// smallest divisors d, so the trial division stops once it has limit + 1 of them, and after
// kMaxTrials whatever it has (a train_batch_size near 2^62 would otherwise take 2^31 trials,
// seconds, before the error is shown; the advice then lists fewer divisors).
std::vector<i64> some_divisors(i64 n, i64 skip, size_t limit) {
  constexpr i64 kMaxTrials = i64{1} << 20;
  std::vector<i64> small, large;
  for (i64 d = 1; d <= kMaxTrials && d <= n / d; ++d) {
    if (n % d) continue;
    small.push_back(d);
    if (d != n / d) large.push_back(n / d);
    if (large.size() > limit) break;  // the limit + 1 largest (one may be `skip`) are known
  }
  std::vector<i64> all(large.begin(), large.end());  // descending
  all.insert(all.end(), small.rbegin(), small.rend());
  std::vector<i64> out;
  for (i64 d : all) {
    if (d != skip && out.size() < limit) out.push_back(d);
  }
  return out;
}

std::string or_list(const std::vector<i64>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? (i + 1 == v.size() ? " or " : ", ") : "") + std::to_string(v[i]);
  return s;
}

// What to change so that TB == MB * GAS * ws, given which values the user wrote.
std::string advice(i64 tb, i64 mb, i64 gas, int ws, bool has_mb, bool has_gas) {
  std::ostringstream os;
  i64 unit = 0;  // TB must be a multiple of this
  if (__builtin_mul_overflow(has_mb ? mb : 1, has_gas ? gas : 1, &unit) || __builtin_mul_overflow(unit, i64{ws}, &unit)) {
    return "reduce train_micro_batch_size_per_gpu or gradient_accumulation_steps";
  }
  const i64 fit = (has_mb && has_gas) ? unit : std::max<i64>(1, tb / unit) * unit;
  os << "set train_batch_size to " << fit;
  if (has_mb && has_gas) {
    os << " (= " << mb << " * " << gas << " * " << ws << ")";
  } else {
    os << " (or another multiple of " << unit << ")";
  }
  if (tb % ws != 0) {
    os << "; train_batch_size must be divisible by the data-parallel world size " << ws;
    return os.str();
  }
  const i64 per_rank = tb / ws;
  if (has_mb && has_gas) {
    if (per_rank % gas == 0) os << ", or train_micro_batch_size_per_gpu to " << per_rank / gas;
    if (per_rank % mb == 0) os << ", or gradient_accumulation_steps to " << per_rank / mb;
  } else if (has_mb) {
    const auto d = some_divisors(per_rank, mb, 4);
    if (!d.empty()) {
      os << ", or train_micro_batch_size_per_gpu to " << or_list(d) << " (a divisor of train_batch_size / world_size = "
         << per_rank << ")";
    }
  } else if (has_gas) {
    const auto d = some_divisors(per_rank, gas, 4);
    if (!d.empty()) {
      os << ", or gradient_accumulation_steps to " << or_list(d) << " (a divisor of train_batch_size / world_size = "
         << per_rank << ")";
    }
  }
  return os.str();
}

}  // namespace

void resolve_batch_sizes(DsConfig& cfg, int ws) {
  DS_CHECK(ws >= 1, cfg.source << ": the data-parallel world size must be >= 1, got " << ws);
  i64 tb = cfg.train_batch_size, mb = cfg.train_micro_batch_size_per_gpu, gas = cfg.gradient_accumulation_steps;
  const bool has_tb = tb > 0, has_mb = mb > 0, has_gas = gas > 0;
  DS_CHECK(tb >= 0 && mb >= 0 && gas >= 0,
           cfg.source << ": batch sizes must be positive (train_batch_size " << tb << ", train_micro_batch_size_per_gpu "
                      << mb << ", gradient_accumulation_steps " << gas << ")");
  if (!has_tb && !has_mb) {
    // HF-style configs write "auto" in every batch key: name where, and what to write.
    std::string autos;
    for (const AutoValue& a : cfg.auto_values)
      if (a.path == "train_batch_size" || a.path == "train_micro_batch_size_per_gpu" ||
          a.path == "gradient_accumulation_steps")
        autos += (autos.empty() ? "" : ", ") + a.path + " (" + a.where + ")";
    DS_CHECK(autos.empty(), cfg.source << ": the batch keys are \"auto\": " << autos
                                       << ": \"auto\" is filled by the Hugging Face Trainer from its own arguments; "
                                          "dstrain needs a number in train_batch_size or train_micro_batch_size_per_gpu "
                                          "(e.g. \"train_micro_batch_size_per_gpu\": 8), the others are then derived");
    DS_THROW(cfg.source << ": either train_batch_size or train_micro_batch_size_per_gpu needs to be provided"
                        << (has_gas ? " (gradient_accumulation_steps alone does not determine the batch)" : ""));
  }
  auto mul = [&](i64 a, i64 b) {
    i64 r = 0;
    DS_CHECK(!__builtin_mul_overflow(a, b, &r),
             cfg.source << ": batch sizes overflow: train_micro_batch_size_per_gpu " << mb << " * gradient_accumulation_steps "
                        << gas << " * world_size " << ws);
    return r;
  };
  // DeepSpeed's table; the divisions are floor divisions.
  if (has_tb && has_mb && has_gas) {
  } else if (has_tb && has_mb) {
    gas = tb / mb / ws;
  } else if (has_tb && has_gas) {
    mb = tb / ws / gas;
  } else if (has_mb && has_gas) {
    tb = mul(mul(mb, gas), ws);
  } else if (has_tb) {
    gas = 1;
    mb = tb / ws;
  } else {
    gas = 1;
    tb = mul(mb, ws);
  }

  const std::string head = cfg.source + ": batch sizes do not fit the data-parallel world size " + std::to_string(ws) + ": ";
  auto fix = [&] { return advice(tb, mb, gas, ws, has_mb, has_gas); };
  // DeepSpeed's assertions, in its order.
  if (mb <= 0) {
    DS_THROW(head << "train_micro_batch_size_per_gpu = train_batch_size " << tb << " // world_size " << ws
                  << " // gradient_accumulation_steps " << gas << " = " << mb << ", which must be > 0; " << fix());
  }
  if (gas <= 0) {
    DS_THROW(head << "gradient_accumulation_steps = train_batch_size " << tb << " // train_micro_batch_size_per_gpu "
                  << mb << " // world_size " << ws << " = " << gas << ", which must be > 0; " << fix());
  }
  if (tb != mul(mul(mb, gas), ws)) {
    DS_THROW(head << "train_batch_size " << tb << " != train_micro_batch_size_per_gpu " << mb
                  << (has_mb ? "" : " (derived)") << " * gradient_accumulation_steps " << gas
                  << (has_gas ? "" : " (derived)") << " * world_size " << ws << "; " << fix());
  }
  cfg.train_batch_size = tb;
  cfg.train_micro_batch_size_per_gpu = mb;
  cfg.gradient_accumulation_steps = gas;
}

}  // namespace ds::config
