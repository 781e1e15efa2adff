// ds_config: validate a DeepSpeed ds_config.json the way dstrain reads it.
//
//   ds_config check FILE [--world_size N] [--steps N] [--lr X]   resolved config as JSON on stdout
//                                         (with pipeline.stages > 1, notes with the grid and batch)
//   ds_config schedule FILE --steps N [--world_size N] [--lr X]  "step,lr" CSV, one row per step
//   ds_config pipe-schedule --stages S --micro_batches M [--stage_id K] [--eval]
//                                         DeepSpeed's pipeline schedule, one line per step
//
// stdout holds only that output. Every diagnostic goes to stderr: warnings (unknown top-level
// keys, deprecated forms), one note per "auto" value filled (--steps and --lr fill what
// train's --steps and --lr would), and errors as one line "ds_config: error: <message>" with
// exit 1. FILE may also be JSON text or base64 JSON, as DeepSpeed's initialize() accepts.
#include <cstdio>
#include <exception>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_usage.h"
#include "pipe_schedule.h"
#include "ds/config/parse.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/log.h"
#include "ds/mpi/comms_logger.h"
#include "ds/pipe/topology.h"
#include "ds/sched/lr_scheduler.h"

namespace {

struct Args {
  std::string file;
  int world_size = 1;
  std::int64_t steps = 0;  // 0: not given
  double lr = -1;          // < 0: not given
};

// The grid and the batch arithmetic of a pipelined config, as notes on stderr.
void show_pipeline(const ds::config::DsConfig& cfg, const ds::pipe::PipeGrid& grid) {
  const ds::pipe::PipeBatch b = ds::pipe::pipe_batch(grid, cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu,
                                                     cfg.gradient_accumulation_steps);
  DS_INFO("note: pipeline: " << grid.stages() << " stages x " << grid.data_parallel_size()
          << " data-parallel ranks = world size " << grid.world_size() << "; train_batch_size " << b.train_batch_size
          << " = train_micro_batch_size_per_gpu " << b.micro_batch_size << " x gradient_accumulation_steps "
          << b.gradient_accumulation_steps << " x data-parallel size " << b.data_parallel_size << "; "
          << b.micro_batches() << " micro-batches per step through each pipe, partition_method "
          << cfg.pipeline.partition_method);
  DS_INFO("note: pipeline: train does not run pipelines yet and refuses pipeline.stages > 1; "
          "`ds_config pipe-schedule --stages " << grid.stages() << " --micro_batches " << b.micro_batches()
          << "` prints the schedule each stage would run");
}

ds::config::DsConfig load_resolved(const Args& a) {
  std::vector<std::string> warnings;  // already logged to stderr by the parser
  ds::config::DsConfig cfg = ds::config::load_config(a.file, &warnings);
  // The ranks form a pipe x data grid: the batch arithmetic is per data-parallel group.
  const ds::pipe::PipeGrid grid(a.world_size, cfg.pipeline.stages);
  ds::config::resolve_batch_sizes(cfg, grid.data_parallel_size());
  if (grid.stages() > 1) show_pipeline(cfg, grid);
  ds::config::KnownValues known;
  if (a.steps > 0) known.total_steps = a.steps;
  if (a.lr >= 0) known.lr = a.lr;
  for (const std::string& line : ds::config::fill_auto_values(cfg, known)) DS_INFO("note: " << line);
  return cfg;
}

// comms_logger.prof_ops names collectives of the communicator layer: checked as the engine
// checks them when the logger is enabled.
void check_comms_logger(const ds::config::DsConfig& cfg) {
  if (!cfg.comms_logger.enabled) return;
  ds::CommsLoggerOptions names;
  names.prof_ops = cfg.comms_logger.prof_ops;
  ds::CommsLog(std::move(names), 0, 1, cfg.source + ": comms_logger.prof_ops");
}

int run_check(const Args& a) {
  const auto cfg = load_resolved(a);
  check_comms_logger(cfg);
  std::cout << ds::config::to_json(cfg).dump(2) << "\n";
  return 0;
}

// The lr the optimizer applies at global steps 1..N: lr() before each step(), as the engine
// does (the scheduler steps once after each successful optimizer step).
int run_schedule(const Args& a) {
  const std::int64_t steps = a.steps;
  const auto cfg = load_resolved(a);
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
  ds::log::set_tool("ds_config");  // diagnostics on stderr, no rank tag
  CLI::App app{"ds_config: check a DeepSpeed ds_config.json as dstrain reads it"};
  app.require_subcommand(1);
  Args a;

  auto* check = app.add_subcommand("check", "print the fully resolved config as JSON");
  check->add_option("FILE", a.file, "ds_config.json (or JSON text, or base64 JSON)")->required();
  // CLI::Range, not PositiveNumber: the message names the real bounds ("not in range 1 to
  // 2147483647") instead of 0 to DBL_MAX.
  const auto positive_int = CLI::Range(1, std::numeric_limits<int>::max());
  check->add_option("--world_size", a.world_size,
                    "number of ranks (the data-parallel size, times pipeline.stages when pipelined)")
      ->check(positive_int);
  const auto positive_steps = CLI::Range(std::int64_t{1}, std::numeric_limits<std::int64_t>::max());
  check->add_option("--steps", a.steps, "optimizer steps of the run: fills a \"total_num_steps\": \"auto\"")
      ->check(positive_steps);
  check->add_option("--lr", a.lr, "learning rate of the run: fills an optimizer \"lr\": \"auto\"")
      ->check(CLI::NonNegativeNumber);

  auto* schedule = app.add_subcommand("schedule", "print step,lr for global steps 1..N");
  schedule->add_option("FILE", a.file, "ds_config.json (or JSON text, or base64 JSON)")->required();
  schedule->add_option("--steps", a.steps, "number of optimizer steps")->required()->check(positive_steps);
  schedule->add_option("--world_size", a.world_size,
                       "number of ranks (the data-parallel size, times pipeline.stages when pipelined)")
      ->check(positive_int);
  schedule->add_option("--lr", a.lr, "learning rate of the run: fills an optimizer \"lr\": \"auto\"")
      ->check(CLI::NonNegativeNumber);

  ds::tools::PipeScheduleArgs pa;
  auto* pipe = app.add_subcommand("pipe-schedule", "print DeepSpeed's pipeline schedule of each stage, step by step");
  pipe->add_option("--stages", pa.stages, "pipeline stages")->required()->check(positive_int);
  pipe->add_option("--micro_batches", pa.micro_batches, "micro-batches per step (gradient_accumulation_steps)")
      ->required()
      ->check(positive_int);
  pipe->add_option("--stage_id", pa.stage_id, "print only this stage (0-based)")
      ->check(CLI::Range(0, std::numeric_limits<int>::max()));
  pipe->add_flag("--eval", pa.eval, "the inference schedule (forward passes only) instead of 1F1B training");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ds::tools::usage_exit(app, e, "ds_config");
  }
  try {
    ds::env::check_all();  // a bad DS_* value: one error line before any work
    if (check->parsed()) return run_check(a);
    if (pipe->parsed()) {
      std::cout << ds::tools::pipe_schedule_text(pa);
      return 0;
    }
    return run_schedule(a);
  } catch (const std::exception& e) {
    std::cerr << "ds_config: error: " << ds::user_message(e) << "\n";
    return 1;
  }
}
