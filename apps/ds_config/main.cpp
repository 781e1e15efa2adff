// ds_config: validate a DeepSpeed ds_config.json the way dstrain reads it.
//
//   ds_config check FILE [--world_size N]            resolved config as JSON on stdout
//   ds_config schedule FILE --steps N [--world_size N]  "step,lr" CSV, one row per optimizer step
//
// Warnings (unknown top-level keys, deprecated forms) go to stderr; errors print one line
// "ds_config: error: <message>" and exit 1. FILE may also be JSON text or base64 JSON, as
// DeepSpeed's initialize() accepts.
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_usage.h"
#include "ds/config/parse.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/sched/lr_scheduler.h"

namespace {

ds::config::DsConfig load_resolved(const std::string& file, int world_size) {
  std::vector<std::string> warnings;  // already logged to stderr by the parser
  ds::config::DsConfig cfg = ds::config::load_config(file, &warnings);
  ds::config::resolve_batch_sizes(cfg, world_size);
  return cfg;
}

int run_check(const std::string& file, int world_size) {
  const auto cfg = load_resolved(file, world_size);
  std::cout << ds::config::to_json(cfg).dump(2) << "\n";
  return 0;
}

// The lr the optimizer applies at global steps 1..N: lr() before each step(), as the engine
// does (the scheduler steps once after each successful optimizer step).
int run_schedule(const std::string& file, int world_size, std::int64_t steps) {
  const auto cfg = load_resolved(file, world_size);
  const ds::config::OptimizerConfig opt = cfg.optimizer.value_or(ds::config::OptimizerConfig{});
  auto sched = cfg.scheduler ? ds::sched::make_scheduler(*cfg.scheduler, opt.lr, opt.betas)
                             : ds::sched::make_constant_scheduler(opt.lr);
  std::string out = "step,lr\n";
  char buf[64];
  for (std::int64_t step = 1; step <= steps; ++step) {
    std::snprintf(buf, sizeof buf, "%lld,%.17g\n", static_cast<long long>(step), sched->lr());
    out += buf;
    sched->step();
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ds_config: check a DeepSpeed ds_config.json as dstrain reads it"};
  app.require_subcommand(1);
  std::string file;
  int world_size = 1;
  std::int64_t steps = 0;

  auto* check = app.add_subcommand("check", "print the fully resolved config as JSON");
  check->add_option("FILE", file, "ds_config.json (or JSON text, or base64 JSON)")->required();
  // CLI::Range, not PositiveNumber: the message names the real bounds ("not in range 1 to
  // 2147483647") instead of 0 to DBL_MAX.
  const auto positive_int = CLI::Range(1, std::numeric_limits<int>::max());
  check->add_option("--world_size", world_size, "data-parallel world size (number of ranks)")
      ->check(positive_int);

  auto* schedule = app.add_subcommand("schedule", "print step,lr for global steps 1..N");
  schedule->add_option("FILE", file, "ds_config.json (or JSON text, or base64 JSON)")->required();
  schedule->add_option("--steps", steps, "number of optimizer steps")
      ->required()
      ->check(CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max()));
  schedule->add_option("--world_size", world_size, "data-parallel world size (number of ranks)")
      ->check(positive_int);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ds::tools::usage_exit(app, e, "ds_config");
  }
  try {
    ds::env::check_all();  // a bad DS_* value: one error line before any work
    if (check->parsed()) return run_check(file, world_size);
    return run_schedule(file, world_size, steps);
  } catch (const std::exception& e) {
    std::cerr << "ds_config: error: " << e.what() << "\n";
    return 1;
  }
}
