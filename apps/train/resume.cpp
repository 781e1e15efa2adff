#include "resume.h"

#include <cstdio>
#include <sstream>

#include "ds/core/error.h"

namespace ds::train {

namespace {

// The sampler where the checkpoint left it, or (older checkpoints) skipped to its step.
void restore_sampler(const io::StateValue& cs, std::int64_t start_step, std::int64_t here_micro_batch,
                     std::int64_t gas, data::DistributedSampler& train_sampler, bool rank0) {
  if (!cs.contains("sampler")) {
    train_sampler.skip_to_step(std::uint64_t(start_step * gas));
    return;
  }
  data::SamplerState s;
  s.epoch = std::uint64_t(cs.at("sampler").at("epoch").as_int());
  s.step = std::uint64_t(cs.at("sampler").at("step").as_int());
  // Saved on another number of ranks (or micro-batch): the same fraction of the epoch,
  // counted in samples. Approximate: the per-rank shards of the epoch differ.
  if (cs.at("sampler").contains("global_micro_batch")) {
    const std::int64_t there = cs.at("sampler").at("global_micro_batch").as_int();
    if (there != here_micro_batch) {
      s.step = rescaled_sampler_step(std::int64_t(s.step), there, here_micro_batch);
      if (rank0)
        std::printf("[train] note: the checkpoint was saved with %lld sequences per micro-step, this run has "
                    "%lld: the data order continues from the same point of the epoch, not the same samples\n",
                    static_cast<long long>(there), static_cast<long long>(here_micro_batch));
    }
  }
  train_sampler.set_state(s);
}

}  // namespace

io::StateValue train_client_state(const Job& j, std::int64_t step, const data::DistributedSampler& train_sampler,
                                  std::int64_t global_micro_batch, const std::mt19937_64& rng) {
  io::StateValue cs;
  cs["step"] = step;
  const auto s = train_sampler.state();
  cs["sampler"]["epoch"] = std::int64_t(s.epoch);
  cs["sampler"]["step"] = std::int64_t(s.step);
  cs["sampler"]["global_micro_batch"] = global_micro_batch;
  std::ostringstream os;
  os << rng;
  cs["rng"] = os.str();
  cs["seed"] = std::int64_t(j.seed);
  cs["model"] = j.spec.describe();  // a resume compares it: n_head changes no tensor shape
  cs["data"] = data_identity_state(data_identity(j));
  return cs;
}

std::int64_t resume(const Job& j, Engine& engine, data::DistributedSampler& train_sampler, std::mt19937_64& rng, int world_size,
                    bool rank0, const CheckpointLoad& load) {
  if (j.opts.load_dir.empty()) return 0;
  std::optional<std::string> tag;
  if (!j.opts.ckpt_id.empty()) tag = j.opts.ckpt_id;
  // The client state is checked (ranges, the model it was saved from) while the engine
  // validates the checkpoint, before anything is applied.
  const auto here_micro_batch = std::int64_t(j.cfg.train_micro_batch_size_per_gpu) * world_size;
  const ResumeExpect expect{j.spec.describe(), train_sampler.steps_per_epoch(), here_micro_batch};
  LoadOptions load_opts;
  load_opts.check_client_state = [&expect](const io::StateValue& cs, const std::string& dir) {
    check_client_state(cs, dir, expect);
  };
  auto loaded = load ? load(j.opts.load_dir, tag, load_opts) : engine.load_checkpoint(j.opts.load_dir, tag, load_opts);
  DS_CHECK(loaded.has_value(), "--load_dir " << j.opts.load_dir << ": no checkpoint found"
                                             << (tag ? " with tag " + *tag : std::string(" (no 'latest' file)")));
  const io::StateValue& cs = loaded->second;
  DS_CHECK(cs.is_map() && cs.contains("step"),
           "checkpoint " << loaded->first << " has no 'step' in its client state (not saved by train)");
  const std::int64_t start_step = cs.at("step").as_int();
  DS_CHECK(start_step == engine.global_steps(),
           "checkpoint " << loaded->first << ": client state step " << start_step
                         << " disagrees with the engine's global_steps " << engine.global_steps());
  restore_sampler(cs, start_step, here_micro_batch, j.cfg.gradient_accumulation_steps, train_sampler, rank0);
  if (cs.contains("rng")) {
    std::istringstream is(cs.at("rng").as_string());
    is >> rng;
    DS_CHECK(!is.fail(), "checkpoint " << loaded->first << ": unreadable rng state");
  }
  if (rank0)
    std::printf("[train] resumed from %s at step %lld\n", loaded->first.c_str(), static_cast<long long>(start_step));
  const std::string data_changed = data_change_warning(cs, loaded->first, data_identity(j));
  if (rank0 && !data_changed.empty()) {
    std::fflush(stdout);
    std::fprintf(stderr, "train: warning: %s\n", data_changed.c_str());
    std::fflush(stderr);
  }
  return start_step;
}

}  // namespace ds::train
