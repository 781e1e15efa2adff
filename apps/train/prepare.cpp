// prepare(): the job's local steps -- config and model shape, tokenizer, data, run length,
// save targets, device, the model object -- each a function below, called in order.
#include <omp.h>

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <thread>
#include <tuple>

#include "batch_check.h"
#include "data_source.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/hash.h"
#include "ds/core/log.h"
#include "ds/data/sampler.h"
#include "ds/engine/args.h"
#include "ds/mpi/device_comm.h"
#include "ds/nn/llama.h"
#include "ds/pipe/topology.h"
#include "init_from.h"
#include "job.h"
#include "save_dir_check.h"
#include "terminal.h"
#include "torch_model.h"
#include "train_loop.h"

namespace ds::train {

namespace {
constexpr std::uint64_t kDefaultSeed = 1234;
constexpr std::int64_t kDefaultSteps = 800;
constexpr std::int64_t kDefaultEvalIters = 20;

std::string data_name(const TrainOptions& opts) {
  return opts.data.empty() ? std::string("the embedded corpus") : opts.data;
}

// --local_rank as DeepSpeed's launchers pass it: must agree with the environment.
void check_local_rank(const TrainOptions& opts, const DistributedContext& dist) {
  engine::DeepSpeedArgs ds_args;
  ds_args.local_rank = opts.local_rank.value_or(-1);
  const int local_rank = engine::resolve_local_rank(ds_args);
  DS_CHECK(!opts.local_rank || local_rank == dist.local_rank,
           "--local_rank " << *opts.local_rank << " disagrees with MPI's local rank " << dist.local_rank);
}

// pipeline.stages (or --pipeline_parallel_size, which wins): the pipe x data grid this rank
// is in (ds/pipe/topology.h; errors name both numbers when stages does not divide the world).
void plan_pipeline(Job& j, const DistributedContext& dist) {
  if (j.opts.pipeline_parallel_size) j.cfg.pipeline.stages = *j.opts.pipeline_parallel_size;
  const pipe::PipeGrid grid(dist.world_size, j.cfg.pipeline.stages);
  j.stages = grid.stages();
  j.dp_size = grid.data_parallel_size();
  j.dp_rank = grid.coord_of(dist.rank).data;
}

// The config file, its batch sizes for the data-parallel size, the model shape and the seed.
void load_config(Job& j, const DistributedContext& dist) {
  const TrainOptions& opts = j.opts;
  DS_CHECK(std::filesystem::exists(opts.config), "config file " << opts.config << " does not exist");
  j.cfg = config::load_config_file(opts.config);
  plan_pipeline(j, dist);  // before the batch arithmetic, which is per data-parallel group
  config::resolve_batch_sizes(j.cfg, j.dp_size);
  j.spec = resolve_model_spec(j.cfg.raw.contains("model") ? j.cfg.raw.at("model") : nlohmann::json(nullptr), opts,
                              opts.config);
  if (j.spec.type == "llama" && j.spec.intermediate_size == 0)  // shown and checked on resume
    j.spec.intermediate_size = nn::llama_default_intermediate(j.spec.n_embd);
  j.seed = opts.seed ? *opts.seed : j.cfg.seed.value_or(kDefaultSeed);
  j.cfg.seed = j.seed;  // the engine seeds the model init with it
}

// --tokenizer: the model needs an output for each of its ids; an unset model.vocab_size
// becomes the tokenizer's (the data's ids are checked against it in split_data).
void load_tokenizer(Job& j) {
  if (j.opts.tokenizer.empty()) return;
  j.tokenizer = tokenizer::BpeTokenizer::load(j.opts.tokenizer);
  if (j.spec.vocab_size == 0) j.spec.vocab_size = j.tokenizer->vocab_size();
  DS_CHECK(j.tokenizer->vocab_size() <= j.spec.vocab_size,
           "--tokenizer " << j.opts.tokenizer << " has " << j.tokenizer->vocab_size()
                          << " tokens but model.vocab_size is " << j.spec.vocab_size
                          << ": the model needs at least the tokenizer's vocab size");
}

// Feature data: the MLP reads the samples as they are -- in_features from the inputs' shape,
// one output per class (model.vocab_size, else the largest class id + 1). The decoders read
// tokens; other models (a TorchScript module) take the batch as it is.
void fit_model_to_arrays(Job& j, const data::Hdf5Dataset& d) {
  const std::string& type = j.spec.type;
  DS_CHECK(type != "gpt" && type != "llama", "--model " << type << " reads tokens, but --data " << j.opts.data
                                                       << " holds arrays (" << d.describe()
                                                       << "); train them with --model mlp");
  if (type != "mlp") return;
  DS_CHECK(d.integer_targets() && d.target_shape().empty(),
           "--model mlp is a classifier: it needs one integer class id per sample, but --data "
               << j.opts.data << " has " << d.describe() << "; choose a targets array of class ids (--data_targets)");
  const auto [lo, hi] = d.target_range();
  DS_CHECK(lo >= 0, "--data " << j.opts.data << ": targets '" << d.targets_name() << "' hold class id " << lo
                              << "; --model mlp needs class ids >= 0");
  if (j.spec.vocab_size == 0) j.spec.vocab_size = std::int64_t(hi) + 1;
  DS_CHECK(hi < j.spec.vocab_size, "--data " << j.opts.data << ": targets '" << d.targets_name() << "' hold class id "
                                             << hi << " but model.vocab_size (the MLP's classes) is "
                                             << j.spec.vocab_size);
  j.spec.in_features = std::int64_t(d.sample_numel());
}

// The vocabulary checked against the model, then the training / validation split (the
// validation part holds at least one window -- or sample -- per rank when there is one).
void split_data(Job& j, const DataSource& src, int world_size) {
  if (src.arrays) {
    fit_model_to_arrays(j, *src.arrays);
    auto parts = src.arrays->split(j.opts.val_fraction, std::size_t(world_size));
    j.train_arrays.emplace(std::move(parts.first));
    j.val_arrays.emplace(std::move(parts.second));
    return;
  }
  const auto min_val_tokens =
      j.opts.val_fraction > 0 ? std::size_t(j.spec.block_size * world_size + 1) : std::size_t(0);
  if (src.shards) {
    // Token shards carry no vocabulary: the largest id + 1 unless model.vocab_size is set (an
    // id past kMaxImpliedVocab is an error naming its file, not a model sized by it).
    if (j.spec.vocab_size == 0) j.spec.vocab_size = src.shards->implied_vocab_size();
    src.shards->check_vocab(j.spec.vocab_size, "model.vocab_size");
    j.shards_note = describe_shards(*src.shards);
    auto parts = src.shards->split(j.opts.val_fraction, min_val_tokens);
    j.train_shards.emplace(std::move(parts.first));
    j.val_shards.emplace(std::move(parts.second));
    return;
  }
  if (j.spec.vocab_size == 0) j.spec.vocab_size = src.text.vocab_size();
  DS_CHECK(src.text.vocab_size() <= j.spec.vocab_size, data_name(j.opts) << " has vocab size "
                                                           << src.text.vocab_size() << " but model.vocab_size is "
                                                           << j.spec.vocab_size);
  std::tie(j.train_data, j.val_data) = src.text.split(j.opts.val_fraction, min_val_tokens);
}

// --prompt: the tokenizer's ids, or its bytes without one.
void encode_prompt(Job& j) {
  if (j.opts.prompt.empty()) return;
  if (j.tokenizer) j.prompt = j.tokenizer->encode(j.opts.prompt);
  else j.prompt.assign(j.opts.prompt.begin(), j.opts.prompt.end());  // bytes are tokens
  for (auto& t : j.prompt) {
    if (!j.tokenizer) t &= 0xFF;
    DS_CHECK(t < j.spec.vocab_size, "--prompt: token " << t << " is not below model.vocab_size " << j.spec.vocab_size);
  }
}

// The HF Trainer's "auto" values in the config: the run length given on the command line
// fills a scheduler's total_num_steps, --lr an optimizer's lr; one note per key, on rank 0.
void fill_auto_values(Job& j) {
  config::KnownValues known;
  if (j.opts.steps || j.opts.epochs) known.total_steps = j.total_steps;
  known.steps_flag = "--steps or --epochs";
  if (j.opts.lr) known.lr = *j.opts.lr;
  for (const std::string& line : config::fill_auto_values(j.cfg, known)) DS_INFO("config: " << line);
}

// Optimizer steps per epoch (at least one micro-batch per rank), then the run length:
// --steps, --epochs, the scheduler's total_num_steps, or the default.
void plan_run_length(Job& j, const DataSource& src, const DistributedContext& dist) {
  const std::int64_t seq = j.spec.block_size;
  const std::size_t train_samples = j.train_samples();
  const auto mb = std::size_t(j.cfg.train_micro_batch_size_per_gpu);
  const int world_size = j.dp_size;  // the data is split over the data-parallel ranks
  DS_CHECK(!j.feature_data() || train_samples >= mb * std::size_t(world_size),
           "--data " << j.opts.data << ": " << train_samples << " training samples (of "
                     << j.data_size() << "; --val_fraction holds out " << j.val_samples()
                     << ") are fewer than one micro-batch of " << mb << " on each of " << world_size
                     << " rank(s); lower train_micro_batch_size_per_gpu or give more samples");
  DS_CHECK(train_samples >= std::size_t(world_size),
           data_name(j.opts) << " is too small: " << (src.shards ? src.shards->size() : src.text.size())
                             << " tokens give " << train_samples << " training windows of block_size+1 = "
                             << seq + 1 << " tokens; need at least one per rank (" << world_size
                             << "). Use a smaller --block_size or more data");
  data::DistributedSampler probe(train_samples, std::size_t(world_size), std::size_t(j.dp_rank), mb, true, j.seed,
                                 j.cfg.dataloader_drop_last);
  DS_CHECK(probe.steps_per_epoch() > 0,
           data_name(j.opts) << " gives " << train_samples << " training windows: fewer than one micro-batch of " << mb
                             << " per rank with dataloader_drop_last; lower train_micro_batch_size_per_gpu");
  j.steps_per_epoch =
      std::max<std::int64_t>(1, std::int64_t(probe.steps_per_epoch()) / j.cfg.gradient_accumulation_steps);

  const TrainOptions& opts = j.opts;
  if (opts.steps)
    j.total_steps = *opts.steps;
  else if (opts.epochs)
    j.total_steps = *opts.epochs * j.steps_per_epoch;
  else if (j.cfg.scheduler && j.cfg.scheduler->total_num_steps)
    j.total_steps = *j.cfg.scheduler->total_num_steps;
  else
    j.total_steps = kDefaultSteps;
  j.eval_iters = opts.eval_iters.value_or(kDefaultEvalIters);
  j.eval_interval = opts.eval_interval.value_or(std::max<std::int64_t>(1, j.total_steps / 5));
  fill_auto_values(j);
}

// --save_dir that cannot take checkpoints fails now, not at the first save after training;
// and the model save at the end must not replace the weights this run starts from.
void check_save_targets(const Job& j) {
  const TrainOptions& opts = j.opts;
  if (opts.save_dir.empty()) return;
  check_save_dir(opts.save_dir);
  if (!opts.init_from.empty() && j.cfg.zero_optimization.gather_16bit_weights_on_model_save)
    check_model_save_target((std::filesystem::path(opts.save_dir) / "model.safetensors").string(), opts.init_from);
}

// What all ranks must share: checked by main() before the first collective, because
// collectives over differently sized models corrupt memory instead of failing cleanly.
void set_identity(Job& j, const DataSource& src) {
  std::ostringstream id;
  id << config::to_json(j.cfg).dump() << '|' << j.spec.describe() << '|' << j.total_steps << '|' << j.eval_interval
     << '|' << j.eval_iters << '|' << j.train_samples() << '|' << j.val_samples() << '|' << j.data_size() << '|'
     << j.opts.load_dir.empty() << '|' << (j.on_gpu ? "cuda" : "cpu");
  j.identity = id.str();
  const auto t = src.text.tokens();
  j.data_hash = src.shards   ? src.shards->fingerprint()
                : src.arrays ? src.arrays->fingerprint()
                             : fnv1a64(t.data(), t.size_bytes());
}

// What a pipelined run does not do (yet another engine would be needed): each an error
// naming the flag or key, before any work.
void check_pipeline_job(const Job& j) {
  if (j.stages == 1) return;
  const std::string grid = "pipeline.stages " + std::to_string(j.stages);
  DS_CHECK(j.spec.type == "gpt" || j.spec.type == "llama",
           grid << ": pipeline parallelism splits the layers of --model gpt or llama; --model " << j.spec.type
                << " is not a layer sequence");
  DS_CHECK(!j.on_gpu, grid << ": pipeline-parallel training runs on CPUs; use --device cpu");
  const std::int64_t interval = j.cfg.pipeline.activation_checkpoint_interval;
  DS_CHECK(interval <= 1, j.opts.config << ": pipeline.activation_checkpoint_interval " << interval
                                        << ": dstrain recomputes one block at a time (1) or none (0)");
  if (j.cfg.pipeline.seed_layers)
    DS_WARN(j.opts.config << ": pipeline.seed_layers has no effect: each layer's initial values already come from "
                             "the seed and the layer's own parameters");
  if (!j.cfg.pipeline.use_reentrant)
    DS_WARN(j.opts.config << ": pipeline.use_reentrant has no effect (a PyTorch autograd mode; dstrain's "
                             "recomputation has one mode)");
}

// The model for this device (nn::make_model), then --init_from: rank 0 checks the file
// against the model now (an agreed error) and reads it at initialize; the engine broadcasts
// rank 0's values.
void build_model(Job& j, int rank) {
  const TrainOptions& opts = j.opts;
  nn::ModelKernels kernels{j.cfg.kernels.attention, j.cfg.kernels.attention_block, j.cfg.kernels.cpu_bf16_gemm,
                           opts.config};
  nn::ModelCheckpointing ckpt;
  // pipeline.activation_checkpoint_interval 1 (a pipelined run): each block recomputed, as the flag does.
  ckpt.enabled = j.cfg.activation_checkpointing.enabled || opts.activation_checkpointing ||
                 (j.stages > 1 && j.cfg.pipeline.activation_checkpoint_interval == 1);
  ckpt.from = opts.activation_checkpointing ? std::string("--activation_checkpointing")
                                            : "activation_checkpointing in " + opts.config;
  ckpt.micro_batch = j.cfg.train_micro_batch_size_per_gpu;
  j.model = is_torchscript(j.spec.type) ? make_torchscript_model(j.spec, ckpt)
                                         : nn::make_model(j.spec, j.on_gpu, j.device, kernels, ckpt);
  if (!is_torchscript(j.spec.type))
    j.build_another = [spec = j.spec, on_gpu = j.on_gpu, device = j.device, kernels, ckpt] {
      return nn::make_model(spec, on_gpu, device, kernels, ckpt);
    };
  if (!opts.init_from.empty())
    // A pipeline's stages initialise apart: each stage's data-parallel rank 0 reads the file.
    j.model.module = init_from_file(std::move(j.model.module), opts.init_from,
                                    j.stages > 1 ? j.dp_rank == 0 : rank == 0, &j.init_from_note);
}

// Two ranks on two cores: without OMP_NUM_THREADS every rank would start one OpenMP thread
// per core and they would fight over the cores. Split the cores among this node's ranks.
void choose_threads(const DistributedContext& dist) {
  if (env::external("OMP_NUM_THREADS")) return;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  omp_set_num_threads(std::max(1, int(cores) / std::max(1, dist.local_size)));
}

}  // namespace

JobPtr prepare(const TrainOptions& opts, const DistributedContext& dist) {
  JobPtr job(new Job);
  Job& j = *job;
  j.opts = opts;
  check_local_rank(opts, dist);
  load_config(j, dist);
  load_tokenizer(j);
  const DataSource src = open_data(opts);
  split_data(j, src, j.dp_size);
  encode_prompt(j);
  plan_run_length(j, src, dist);
  check_save_targets(j);
  j.on_gpu = is_torchscript(j.spec.type) ? torchscript_on_gpu(opts.device) : nn::model_on_gpu(j.spec, opts.device);
  if (j.on_gpu) j.device = shared_device(dist.device, visible_device_count());
  check_pipeline_job(j);
  set_identity(j, src);
  // Progress bar only on a terminal (rank 0's stdout; run() shares rank 0's verdict).
  j.bar = dist.rank == 0 && (opts.progress == "bar" || (opts.progress == "auto" && stdout_is_terminal()));
  build_model(j, dist.rank);
  choose_threads(dist);
  // A micro-batch the data cannot fill (a warning), or more memory than this machine has (an
  // error now, not the OOM killer's silent end of a rank once training touches the pages).
  check_micro_batch(j.cfg, *j.model.module,
                    BatchPlan{j.cfg.train_micro_batch_size_per_gpu, j.tokens_per_sample(), j.train_samples(),
                              dist.world_size, dist.local_size, j.on_gpu, data_name(opts)},
                    dist.rank == 0);
  return job;
}

void JobDeleter::operator()(Job* j) const { delete j; }

std::uint64_t job_fingerprint(const Job& j) {
  return fnv1a64(j.identity.data(), j.identity.size(), j.data_hash);
}

std::string job_summary(const Job& j) {
  std::ostringstream os;
  os << j.spec.describe() << ", steps " << j.total_steps << ", train batch " << j.cfg.train_batch_size << ", "
     << j.data_size() << " data " << j.data_unit();
  return os.str();
}

}  // namespace ds::train
