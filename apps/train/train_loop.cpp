// The training job: prepare() (local: config, model shape, data, model object) and run()
// (collective: engine, loop, validation, checkpoints, sample, summary).
#include "train_loop.h"

#include <unistd.h>

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "ds/config/parse.h"
#include "ds/core/hash.h"
#include "ds/core/env.h"
#include "ds/core/error.h"
#include "ds/core/file_read.h"
#include "ds/core/proc_status.h"
#include "ds/data/dataset.h"
#include "ds/data/sampler.h"
#include "ds/data/token_shards.h"
#include "ds/engine/args.h"
#include "ds/engine/engine.h"
#include "ds/optim/optimizer.h"
#include "ds/io/state_value.h"
#include "ds/mpi/comm_factory.h"
#include "ds/mpi/device_comm.h"
#include "ds/nn/gemm.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/nn/mlp.h"
#include "ds/tokenizer/bpe.h"
#if DS_NN_HAVE_CUDA
#include <cuda_runtime.h>

#include "ds/core/cuda_check.h"
#include "ds/nn/gpt_cuda.h"
#include "ds/nn/llama_cuda.h"
#endif
#include "batch_check.h"
#include "client_state_check.h"
#include "init_from.h"
#include "model_spec.h"
#include "report.h"
#include "save_dir_check.h"

namespace ds::train {

namespace {
constexpr std::uint64_t kDefaultSeed = 1234;
constexpr std::int64_t kDefaultSteps = 800;
constexpr std::int64_t kDefaultEvalIters = 20;
constexpr std::int64_t kLossWindow = 10;  // the summary's train loss: mean of the last steps
}  // namespace

struct Job {
  TrainOptions opts;
  config::DsConfig cfg;  // batch sizes resolved for the world size
  ModelSpec spec;
  std::uint64_t seed = kDefaultSeed;
  data::TextDataset train_data, val_data;
  // nanoGPT / llm.c token files (memory-mapped) instead of the TextDatasets above.
  std::optional<data::TokenShards> train_shards, val_shards;
  const data::WindowSource& train_src() const {
    if (train_shards) return *train_shards;
    return train_data;
  }
  const data::WindowSource& val_src() const {
    if (val_shards) return *val_shards;
    return val_data;
  }
  std::string shards_note;  // "3 llm.c shards, uint16 tokens" (empty for other data)
  std::unique_ptr<Module> model;
  // The GPT's sampler (CPU or GPU model); empty for the MLP, which generates nothing.
  std::function<std::vector<std::int32_t>(std::span<const std::int32_t>, int, float, std::uint64_t)> generate;
  bool on_gpu = false;
  std::int64_t steps_per_epoch = 0;  // optimizer steps per epoch of the training split
  std::int64_t total_steps = 0;      // the run ends after this global step
  std::int64_t eval_interval = 0;
  std::int64_t eval_iters = 0;
  bool bar = false;
  double flops_per_token = 0;
  std::string identity;  // what ranks must agree on (see job_fingerprint)
  std::uint64_t data_hash = 0;
  std::optional<tokenizer::BpeTokenizer> tokenizer;  // --tokenizer
  std::vector<std::int32_t> prompt;                  // --prompt, encoded
  std::string init_from_note;  // --init_from: what rank 0 loaded (empty without the flag)
  // Activation checkpointing (config section or flag): the line rank 0 prints (empty when off).
  std::function<std::string()> checkpointing_note;
  // This rank's GPU: its local rank, modulo the visible GPUs when the ranks share them.
  int device = 0;

};

void JobDeleter::operator()(Job* j) const { delete j; }

namespace {
// --device: auto picks cuda when this build has the GPU model and a GPU is visible. Ranks
// that outnumber the node's GPUs share them (ds/mpi/device_comm.h).
bool use_gpu(const std::string& device) {
  if (device == "cpu") return false;
#if DS_NN_HAVE_CUDA
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) cudaGetLastError();  // no driver: leave no sticky error behind
  const bool visible = rc == cudaSuccess && count > 0;
  if (device == "cuda") {
    DS_CHECK(visible, "--device cuda: no CUDA device is visible ("
                          << (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices") << ")");
  }
  return visible;
#else
  DS_CHECK(device != "cuda", "--device cuda: this train was built without CUDA (DS_WITH_CUDA)");
  return false;
#endif
}

std::string gpu_name(int device) {
#if DS_NN_HAVE_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    return "cuda:" + std::to_string(device) + " (" + prop.name + ")";
#endif
  return "cuda:" + std::to_string(device);
}

}  // namespace

std::uint64_t job_fingerprint(const Job& j) {
  return fnv1a64(j.identity.data(), j.identity.size(), j.data_hash);
}

std::string job_summary(const Job& j) {
  std::ostringstream os;
  os << j.spec.describe() << ", steps " << j.total_steps << ", train batch " << j.cfg.train_batch_size << ", "
     << j.train_src().size() + j.val_src().size() << " data tokens";
  return os.str();
}

namespace {

// Two ranks on two cores: without OMP_NUM_THREADS every rank would start one OpenMP thread
// per core and they would fight over the cores. Split the cores among this node's ranks.
void choose_threads(const DistributedContext& dist) {
  if (env::external("OMP_NUM_THREADS")) return;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  omp_set_num_threads(std::max(1, int(cores) / std::max(1, dist.local_size)));
}

// --model mlp on byte-level text: the MLP classifies the next byte from the one-hot
// encoding of the last block_size bytes (one prediction per sequence).
class MlpBatcher {
 public:
  MlpBatcher(std::int64_t seq, std::int64_t vocab) : seq_(seq), vocab_(vocab) {}
  Batch operator()(const Batch& tokens) {
    const std::int64_t B = tokens.batch;
    features_.assign(std::size_t(B * seq_ * vocab_), 0.0f);
    targets_.resize(std::size_t(B));
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t t = 0; t < seq_; ++t)
        features_[std::size_t((b * seq_ + t) * vocab_ + tokens.inputs[std::size_t(b * seq_ + t)])] = 1.0f;
      targets_[std::size_t(b)] = tokens.targets[std::size_t(b * seq_ + seq_ - 1)];
    }
    Batch out;
    out.features = features_;
    out.targets = targets_;
    out.batch = B;
    out.feature_dim = seq_ * vocab_;
    return out;
  }

 private:
  std::int64_t seq_, vocab_;
  std::vector<float> features_;
  std::vector<std::int32_t> targets_;
};

// Whether rank 0's stdout reaches a person at a terminal. Open MPI gives local ranks a pty
// even when mpirun's own output goes to a pipe or a file, so under a launcher we walk up the
// process tree past everything writing to our pty (wrappers such as `time`) to the launcher
// (mpirun or its daemon) and look at where it writes.
bool stdout_is_terminal() {
  if (!::isatty(STDOUT_FILENO)) return false;
  const bool launched = env::external("OMPI_COMM_WORLD_SIZE") || env::external("PMI_SIZE") ||
                        env::external("PMIX_RANK") || env::external("SLURM_STEP_ID");
  if (!launched) return true;
  auto fd1_of = [](const std::string& pid) {
    std::error_code ec;
    auto t = std::filesystem::read_symlink("/proc/" + pid + "/fd/1", ec).string();
    return ec ? std::string() : t;
  };
  auto parent_of = [](const std::string& pid) {
    std::ifstream in("/proc/" + pid + "/stat");
    std::string line;
    std::getline(in, line);
    const auto close = line.rfind(')');  // "pid (comm) state ppid ..."
    if (close == std::string::npos) return std::string();
    std::istringstream rest(line.substr(close + 1));
    std::string state, ppid;
    rest >> state >> ppid;
    return ppid;
  };
  const std::string mine = fd1_of("self");
  if (mine.empty()) return true;  // cannot tell: trust isatty
  std::string pid = std::to_string(::getppid());
  for (int depth = 0; depth < 16 && !pid.empty() && pid != "0" && pid != "1"; ++depth) {
    const std::string theirs = fd1_of(pid);
    if (theirs.empty()) return true;
    if (theirs != mine) return theirs.rfind("/dev/pts/", 0) == 0 || theirs.rfind("/dev/tty", 0) == 0;
    pid = parent_of(pid);
  }
  return true;
}

std::string tag_for_step(std::int64_t step) { return "global_step" + std::to_string(step); }

// What the run trains on, as its checkpoints record it (a resume on other data warns).
DataIdentity data_identity(const Job& j) {
  return {j.opts.data.empty() ? std::string("the embedded corpus") : j.opts.data,
          std::int64_t(j.train_src().size() + j.val_src().size()), j.data_hash};
}

}  // namespace

JobPtr prepare(const TrainOptions& opts, const DistributedContext& dist) {
  JobPtr job(new Job);
  Job& j = *job;
  j.opts = opts;

  // --local_rank as DeepSpeed's launchers pass it: must agree with the environment.
  engine::DeepSpeedArgs ds_args;
  ds_args.local_rank = opts.local_rank.value_or(-1);
  const int local_rank = engine::resolve_local_rank(ds_args);
  DS_CHECK(!opts.local_rank || local_rank == dist.local_rank,
           "--local_rank " << *opts.local_rank << " disagrees with MPI's local rank " << dist.local_rank);

  DS_CHECK(std::filesystem::exists(opts.config), "config file " << opts.config << " does not exist");
  j.cfg = config::load_config_file(opts.config);
  config::resolve_batch_sizes(j.cfg, dist.world_size);
  j.spec = resolve_model_spec(j.cfg.raw.contains("model") ? j.cfg.raw.at("model") : nlohmann::json(nullptr),
                              opts, opts.config);
  if (j.spec.type == "llama" && j.spec.intermediate_size == 0)  // shown and checked on resume
    j.spec.intermediate_size = nn::llama_default_intermediate(j.spec.n_embd);
  j.seed = opts.seed ? *opts.seed : j.cfg.seed.value_or(kDefaultSeed);
  j.cfg.seed = j.seed;  // the engine seeds the model init with it

  // --tokenizer: the model needs an output for each of its ids; an unset model.vocab_size
  // becomes the tokenizer's (the data's ids are checked against it below).
  if (!opts.tokenizer.empty()) {
    j.tokenizer = tokenizer::BpeTokenizer::load(opts.tokenizer);
    if (j.spec.vocab_size == 0) j.spec.vocab_size = j.tokenizer->vocab_size();
    DS_CHECK(j.tokenizer->vocab_size() <= j.spec.vocab_size,
             "--tokenizer " << opts.tokenizer << " has " << j.tokenizer->vocab_size() << " tokens but model.vocab_size is "
                            << j.spec.vocab_size << ": the model needs at least the tokenizer's vocab size");
  }

  // Data: the embedded corpus, a text file, a DSTOKENS file (by magic), or nanoGPT / llm.c
  // token files: a glob, an llm.c shard (by magic), a .bin file, or any file with --data_dtype.
  data::TextDataset all;
  std::optional<data::TokenShards> shards;
  const int raw_width = opts.data_dtype == "uint32" ? 4 : 2;
  if (opts.data.empty()) {
    all = data::TextDataset::embedded();
  } else if (opts.data.find_first_of("*?[") != std::string::npos) {
    shards = data::TokenShards::open(opts.data, raw_width);
  } else {
    DS_CHECK(std::filesystem::exists(opts.data), "--data " << opts.data << ": no such file");
    check_regular_file(opts.data, "--data");  // a FIFO would block the fopen below; /dev/zero never ends
    char magic[8] = {};
    if (std::FILE* f = std::fopen(opts.data.c_str(), "rb")) {
      const std::size_t got = std::fread(magic, 1, sizeof magic, f);
      std::fclose(f);
      const bool dstokens = got == 8 && std::string_view(magic, 8) == "DSTOKENS";
      const bool bin = std::filesystem::path(opts.data).extension() == ".bin";
      if (dstokens)
        all = data::TextDataset::from_token_file(opts.data);
      else if (bin || !opts.data_dtype.empty() || data::TokenShards::has_llmc_magic(opts.data))
        shards = data::TokenShards::open(opts.data, raw_width);
      else
        all = data::TextDataset::from_file(opts.data);
    } else {
      DS_THROW("--data " << opts.data << ": cannot open for reading");
    }
  }
  const std::string data_name = opts.data.empty() ? std::string("the embedded corpus") : opts.data;
  const std::int64_t seq = j.spec.block_size;
  const auto min_val_tokens = std::size_t(seq * dist.world_size + 1);
  if (shards) {
    // Token shards carry no vocabulary: the largest id + 1 unless model.vocab_size is set (an
    // id past kMaxImpliedVocab is an error naming its file, not a model sized by it).
    if (j.spec.vocab_size == 0) j.spec.vocab_size = shards->implied_vocab_size();
    shards->check_vocab(j.spec.vocab_size, "model.vocab_size");
    const auto& ps = shards->pieces();
    j.shards_note = std::to_string(ps.size()) + (ps[0].header_bytes > 0 ? " llm.c shard" : " raw token file") +
                    (ps.size() > 1 ? "s" : "") + ", " + (ps[0].width == 2 ? "uint16" : "uint32") +
                    " tokens, memory-mapped";
    auto parts = shards->split(opts.val_fraction, opts.val_fraction > 0 ? min_val_tokens : 0);
    j.train_shards.emplace(std::move(parts.first));
    j.val_shards.emplace(std::move(parts.second));
  } else {
    if (j.spec.vocab_size == 0) j.spec.vocab_size = all.vocab_size();
    DS_CHECK(all.vocab_size() <= j.spec.vocab_size,
             data_name << " has vocab size " << all.vocab_size() << " but model.vocab_size is " << j.spec.vocab_size);
    std::tie(j.train_data, j.val_data) = all.split(opts.val_fraction, opts.val_fraction > 0 ? min_val_tokens : 0);
  }
  if (!opts.prompt.empty()) {
    if (j.tokenizer) j.prompt = j.tokenizer->encode(opts.prompt);
    else j.prompt.assign(opts.prompt.begin(), opts.prompt.end());  // bytes are tokens
    for (auto& t : j.prompt) {
      if (!j.tokenizer) t &= 0xFF;
      DS_CHECK(t < j.spec.vocab_size, "--prompt: token " << t << " is not below model.vocab_size " << j.spec.vocab_size);
    }
  }
  const std::size_t train_samples = j.train_src().num_samples(seq);
  DS_CHECK(train_samples >= std::size_t(dist.world_size),
           data_name << " is too small: " << (shards ? shards->size() : all.size()) << " tokens give " << train_samples
                     << " training windows of block_size+1 = " << seq + 1 << " tokens; need at least one per rank ("
                     << dist.world_size << "). Use a smaller --block_size or more data");

  const auto mb = std::size_t(j.cfg.train_micro_batch_size_per_gpu);
  const std::int64_t gas = j.cfg.gradient_accumulation_steps;
  {
    data::DistributedSampler probe(train_samples, dist.world_size, dist.rank, mb, true, j.seed,
                                   j.cfg.dataloader_drop_last);
    DS_CHECK(probe.steps_per_epoch() > 0,
             data_name << " gives " << train_samples << " training windows: fewer than one micro-batch of "
                       << mb << " per rank with dataloader_drop_last; lower train_micro_batch_size_per_gpu");
    j.steps_per_epoch = std::max<std::int64_t>(1, std::int64_t(probe.steps_per_epoch()) / gas);
  }

  // Run length: --steps, --epochs, the scheduler's total_num_steps, or the default.
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

  // --save_dir that cannot take checkpoints fails now, not at the first save after training.
  if (!opts.save_dir.empty()) check_save_dir(opts.save_dir);
  // ... and the model save at the end must not replace the weights this run starts from.
  if (!opts.save_dir.empty() && !opts.init_from.empty() && j.cfg.zero_optimization.gather_16bit_weights_on_model_save)
    check_model_save_target((std::filesystem::path(opts.save_dir) / "model.safetensors").string(), opts.init_from);

  // The Llama's GPU model (LlamaCuda) is compiled but has not run on a GPU yet: only an
  // explicit --device cuda takes it; --device auto keeps the Llama on the CPU.
  j.on_gpu = !(opts.device == "auto" && j.spec.type == "llama") && use_gpu(opts.device);
  if (j.on_gpu) j.device = shared_device(dist.device, visible_device_count());

  // What all ranks must share: checked by main() before the first collective, because
  // collectives over differently sized models corrupt memory instead of failing cleanly.
  {
    std::ostringstream id;
    id << config::to_json(j.cfg).dump() << '|' << j.spec.describe() << '|' << j.total_steps << '|' << j.eval_interval
       << '|' << j.eval_iters << '|' << j.train_src().size() << '|' << j.val_src().size() << '|' << opts.load_dir.empty() << '|' << (j.on_gpu ? "cuda" : "cpu");
    j.identity = id.str();
    const auto t = all.tokens();
    j.data_hash = shards ? shards->fingerprint() : fnv1a64(t.data(), t.size_bytes());
  }

  // Progress bar only on a terminal (rank 0's stdout; run() shares rank 0's verdict).
  j.bar = dist.rank == 0 && (opts.progress == "bar" || (opts.progress == "auto" && stdout_is_terminal()));

#if DS_NN_HAVE_CUDA
  const bool gpu_model = j.spec.type == "gpt" || j.spec.type == "llama";
  const char* gpu_models = "the GPU path has the GPT and the Llama";
#else
  const bool gpu_model = j.spec.type == "gpt";
  const char* gpu_models = "the GPU path has the GPT";
#endif
  if (j.on_gpu && !gpu_model)
    DS_THROW("--model " << j.spec.type << " runs on the CPU only; add --device cpu (" << gpu_models << ")");
  // DeepSpeed recomputes where the model calls checkpoint(); here the built-in CPU decoders do
  // it for every block when the config's section (or the flag) asks.
  const bool checkpointing = j.cfg.activation_checkpointing.enabled || opts.activation_checkpointing;
  const std::string checkpointing_from =
      opts.activation_checkpointing ? std::string("--activation_checkpointing") : "activation_checkpointing in " + opts.config;
  if (checkpointing && j.on_gpu)
    DS_THROW(checkpointing_from << ": the CUDA " << (j.spec.type == "llama" ? "Llama" : "GPT")
                                << " does not recompute activations; remove it or add --device cpu");
  auto note_of = [&](auto* m) {
    m->set_activation_checkpointing(true);
    j.checkpointing_note = [m, B = std::int64_t(j.cfg.train_micro_batch_size_per_gpu), T = j.spec.block_size] {
      char line[160];
      std::snprintf(line, sizeof line, "on: activation arena %.1f MiB per micro-batch of %lld x %lld tokens (%.1f MiB without)",
                    double(m->activation_bytes(B, T)) / 1048576.0, static_cast<long long>(B), static_cast<long long>(T),
                    double(m->activation_bytes(B, T, false)) / 1048576.0);
      return std::string(line);
    };
  };
  if (j.spec.type == "gpt") {
    nn::GptConfig g;
    g.n_layer = j.spec.n_layer;
    g.n_head = j.spec.n_head;
    g.n_embd = j.spec.n_embd;
    g.block_size = j.spec.block_size;
    g.vocab_size = j.spec.vocab_size;
#if DS_NN_HAVE_CUDA
    if (j.on_gpu) {
      DS_CUDA_CHECK(cudaSetDevice(j.device));
      // kernels.attention: "auto" is the materialised path (faster than flash at GPT-2 124M
      // on an H200, docs/dev/gpu.md); "flash" where the dtype and head size allow.
      nn::GptCudaAttention att;
      att.flash = j.cfg.kernels.attention == "flash";
      att.block = j.cfg.kernels.attention_block;
      auto gpt = std::make_unique<nn::GptCuda>(g, /*allow_tf32=*/false, att);
      j.generate = [m = gpt.get()](auto ctx, int n, float temp, std::uint64_t seed) { return m->generate(ctx, n, temp, seed); };
      j.flops_per_token = gpt->flops_per_token();
      j.model = std::move(gpt);
    }
#endif
    if (!j.on_gpu) {
      // kernels.cpu_bf16_gemm checked now, where a bad value is one agreed error line; the
      // choice itself is agreed between the ranks in run().
      (void)nn::parse_cpu_bf16_gemm(j.cfg.kernels.cpu_bf16_gemm, "kernels.cpu_bf16_gemm");
      auto gpt = std::make_unique<nn::Gpt>(g);
      if (checkpointing) note_of(gpt.get());
      j.generate = [m = gpt.get()](auto ctx, int n, float temp, std::uint64_t seed) { return m->generate(ctx, n, temp, seed); };
      j.flops_per_token = gpt->flops_per_token();
      j.model = std::move(gpt);
    }
  } else if (j.spec.type == "llama") {
    nn::LlamaConfig c;
    c.n_layer = j.spec.n_layer;
    c.n_head = j.spec.n_head;
    c.n_kv_head = j.spec.n_kv_head;
    c.n_embd = j.spec.n_embd;
    c.intermediate_size = j.spec.intermediate_size;
    c.block_size = j.spec.block_size;
    c.vocab_size = j.spec.vocab_size;
    c.rope_theta = j.spec.rope_theta;
    c.rms_norm_eps = j.spec.rms_norm_eps;
    c.tie_embeddings = j.spec.tie_embeddings;
#if DS_NN_HAVE_CUDA
    if (j.on_gpu) {
      // Compiled, not yet run on a GPU (docs/dev/gpu.md): materialised block-causal attention
      // only, so kernels.attention "flash" is refused rather than silently not used.
      DS_CHECK(j.cfg.kernels.attention != "flash",
               opts.config << ": kernels.attention \"flash\": the CUDA Llama has no flash attention; use \"auto\" or add --device cpu");
      DS_CUDA_CHECK(cudaSetDevice(j.device));
      auto llama = std::make_unique<nn::LlamaCuda>(c, /*allow_tf32=*/false, j.cfg.kernels.attention_block);
      j.generate = [m = llama.get()](auto ctx, int n, float temp, std::uint64_t seed) { return m->generate(ctx, n, temp, seed); };
      j.flops_per_token = llama->flops_per_token();
      j.model = std::move(llama);
    }
#endif
    if (!j.on_gpu) {
      (void)nn::parse_cpu_bf16_gemm(j.cfg.kernels.cpu_bf16_gemm, "kernels.cpu_bf16_gemm");
      auto llama = std::make_unique<nn::Llama>(c);
      if (checkpointing) note_of(llama.get());
      j.generate = [m = llama.get()](auto ctx, int n, float temp, std::uint64_t seed) { return m->generate(ctx, n, temp, seed); };
      j.flops_per_token = llama->flops_per_token();
      j.model = std::move(llama);
    }
  } else {
    nn::MlpConfig m;
    m.in_features = j.spec.block_size * j.spec.vocab_size;
    m.hidden = j.spec.n_embd;
    m.n_classes = j.spec.vocab_size;
    m.n_hidden_layers = j.spec.n_layer;
    auto mlp = std::make_unique<nn::Mlp>(m);
    if (checkpointing)
      j.checkpointing_note = [] { return std::string("no effect on --model mlp (it has no blocks to recompute)"); };
    // FLOPs per sample spread over the block_size tokens a sample reads.
    j.flops_per_token = mlp->flops_per_sample() / double(j.spec.block_size);
    j.model = std::move(mlp);
  }
  // --init_from: rank 0 checks the file against the model now (an agreed error) and reads it
  // at initialize; the engine broadcasts rank 0's values.
  if (!opts.init_from.empty())
    j.model = init_from_file(std::move(j.model), opts.init_from, dist.rank == 0, &j.init_from_note);
  choose_threads(dist);
  // A micro-batch the data cannot fill (a warning), or more memory than this machine has (an
  // error now, not the OOM killer's silent end of a rank once training touches the pages).
  check_micro_batch(j.cfg, *j.model,
                    BatchPlan{std::int64_t(mb), seq, train_samples, dist.world_size, dist.local_size, j.on_gpu, data_name},
                    dist.rank == 0);
  return job;
}

namespace {

struct Bf16GemmChoice {
  bool applies = false;  // a CPU GPT on bf16 working parameters
  std::string detail;    // what "auto" measured, for the log line
};

// kernels.cpu_bf16_gemm for the CPU GPT: "auto" times the bf16 and fp32 kernels on each rank
// (ds/nn/gemm.h) and the ranks take the minimum, so all run bf16 only when every rank
// measured it faster: the ranks compute the same numbers. Collective (every rank has the
// same config: the job fingerprints agreed).
Bf16GemmChoice agree_cpu_bf16_gemm(const Job& j, Communicator& comm) {
  Bf16GemmChoice c;
  c.applies = !j.on_gpu && (j.spec.type == "gpt" || j.spec.type == "llama") && j.cfg.bf16.enabled;
  if (!c.applies) return c;
  const nn::CpuBf16Gemm mode = nn::parse_cpu_bf16_gemm(j.cfg.kernels.cpu_bf16_gemm, "kernels.cpu_bf16_gemm");
  std::int32_t bf16 = nn::cpu_bf16_gemm_choice(mode) ? 1 : 0;
  const std::int32_t mine = bf16;
  comm.all_reduce(TensorView{&bf16, 1, DType::I32}, ReduceOp::Min);
  nn::set_cpu_bf16_gemm(bf16 == 1);
  if (mode == nn::CpuBf16Gemm::Auto) {
    const nn::Bf16GemmTiming& t = nn::measure_bf16_gemm();
    char buf[160];
    if (t.bf16_seconds > 0)
      std::snprintf(buf, sizeof buf, ": bf16 kernel %.2fx the fp32 one on rank 0, bf16 needs %.2fx%s",
                    t.f32_seconds / t.bf16_seconds, nn::kBf16GemmMinSpeedup,
                    mine != bf16 ? "; another rank measured less" : "");
    else
      std::snprintf(buf, sizeof buf, ": this CPU has no AVX512-BF16");
    c.detail = buf;
  }
  return c;
}

}  // namespace

void run(Job& j, DistributedContext& dist) {
  const bool rank0 = dist.rank == 0;
  const std::int64_t seq = j.spec.block_size;
  const std::int64_t gas = j.cfg.gradient_accumulation_steps;
  const auto mb = std::size_t(j.cfg.train_micro_batch_size_per_gpu);
  Communicator& comm = *dist.comm;

  // The engine's steps_per_print lines would tear the bar, so with the bar they are off --
  // on every rank, so that all engines run with the same config.
  std::int32_t bar_flag = j.bar ? 1 : 0;
  comm.broadcast(TensorView{&bar_flag, 1, DType::I32}, 0);
  if (bar_flag) j.cfg.steps_per_print.reset();

  // The GPU path reduces gradients over a device communicator of the same ranks: NCCL or
  // staged, by communication.device_backend and the rule in ds/mpi/device_comm.h.
  std::shared_ptr<Communicator> device_comm;
  if (j.on_gpu && dist.world_size > 1)
    device_comm = make_device_communicator(dist, j.cfg.communication.device_backend,
                                           j.opts.config + ": communication.device_backend");
  if (rank0 && j.on_gpu) std::printf("[train] device: %s\n", gpu_name(j.device).c_str());
  const Bf16GemmChoice bf16_gemm = agree_cpu_bf16_gemm(j, comm);
  auto init = ds::initialize(j.cfg, *j.model, dist.comm, device_comm);
  Engine& engine = *init.engine;

  data::Loader train_loader(j.train_src(), seq,
                            data::DistributedSampler(j.train_src().num_samples(seq), dist.world_size, dist.rank, mb,
                                                     true, j.seed, j.cfg.dataloader_drop_last));
  const std::size_t val_samples = j.val_src().size() > 0 ? j.val_src().num_samples(seq) : 0;
  std::optional<data::Loader> val_loader;
  if (val_samples >= std::size_t(dist.world_size) && j.eval_iters > 0)
    val_loader.emplace(j.val_src(), seq,
                       data::DistributedSampler(val_samples, dist.world_size, dist.rank, mb, false, j.seed, false));
  std::mt19937_64 rng(j.seed);

  // Resume: the engine restores parameters, optimizer, scheduler and counters; the client
  // state carries the step, the sampler position and our RNG.
  std::int64_t start_step = 0;
  if (!j.opts.load_dir.empty()) {
    std::optional<std::string> tag;
    if (!j.opts.ckpt_id.empty()) tag = j.opts.ckpt_id;
    // The client state is checked (ranges, the model it was saved from) while the engine
    // validates the checkpoint, before anything is applied.
    const auto here_micro_batch = std::int64_t(mb) * dist.world_size;
    const ResumeExpect expect{j.spec.describe(), train_loader.sampler().steps_per_epoch(), here_micro_batch};
    LoadOptions load_opts;
    load_opts.check_client_state = [&expect](const io::StateValue& cs, const std::string& dir) {
      check_client_state(cs, dir, expect);
    };
    auto loaded = engine.load_checkpoint(j.opts.load_dir, tag, load_opts);
    DS_CHECK(loaded.has_value(), "--load_dir " << j.opts.load_dir << ": no checkpoint found"
                                               << (tag ? " with tag " + *tag : std::string(" (no 'latest' file)")));
    const io::StateValue& cs = loaded->second;
    DS_CHECK(cs.is_map() && cs.contains("step"),
             "checkpoint " << loaded->first << " has no 'step' in its client state (not saved by train)");
    start_step = cs.at("step").as_int();
    DS_CHECK(start_step == engine.global_steps(),
             "checkpoint " << loaded->first << ": client state step " << start_step
                           << " disagrees with the engine's global_steps " << engine.global_steps());
    if (cs.contains("sampler")) {
      data::SamplerState s;
      s.epoch = std::uint64_t(cs.at("sampler").at("epoch").as_int());
      s.step = std::uint64_t(cs.at("sampler").at("step").as_int());
      // Saved on another number of ranks (or micro-batch): the same fraction of the epoch,
      // counted in samples. Approximate: the per-rank shards of the epoch differ.
      const auto here = std::int64_t(mb) * dist.world_size;
      if (cs.at("sampler").contains("global_micro_batch")) {
        const std::int64_t there = cs.at("sampler").at("global_micro_batch").as_int();
        if (there != here) {
          s.step = rescaled_sampler_step(std::int64_t(s.step), there, here);
          if (rank0)
            std::printf("[train] note: the checkpoint was saved with %lld sequences per micro-step, this run has "
                        "%lld: the data order continues from the same point of the epoch, not the same samples\n",
                        static_cast<long long>(there), static_cast<long long>(here));
        }
      }
      train_loader.sampler().set_state(s);
    } else {
      train_loader.sampler().skip_to_step(std::uint64_t(start_step * gas));
    }
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
  }

  // Before the first step: every tag this run will save is free in --save_dir, and there is
  // room for a checkpoint (rank 0 checks; an error ends the job through abort_job).
  if (rank0 && !j.opts.save_dir.empty()) {
    SavePlan plan;
    plan.start_step = start_step;
    plan.total_steps = j.total_steps;
    plan.save_interval = j.opts.save_interval.value_or(0);
    const std::uint64_t numel = engine.partition_map().total_numel;
    const std::uint64_t flat_states = 1 + engine.optimizer()->state_tensors().size();  // fp32 master + optimizer
    plan.checkpoint_bytes = numel * dtype_size(engine.working_dtype()) + flat_states * numel * sizeof(float) +
                            (std::uint64_t(1) << 20) + std::uint64_t(dist.world_size) * 65536;
    check_save_plan(j.opts.save_dir, plan);
  }

  const std::int64_t tokens_per_step = engine.train_batch_size() * seq;
  if (rank0) {
    std::printf("[train] model: %s (%zu parameters)\n", j.spec.describe().c_str(),
                [&] {
                  std::size_t n = 0;
                  for (const auto& p : j.model->parameters()) n += p.numel();
                  return n;
                }());
    if (!j.init_from_note.empty()) std::printf("[train] init: %s\n", j.init_from_note.c_str());
    if (j.checkpointing_note) std::printf("[train] activation checkpointing: %s\n", j.checkpointing_note().c_str());
    if (bf16_gemm.applies && engine.working_dtype() == DType::BF16)
      std::printf("[train] bf16: Linear GEMMs %s (kernels.cpu_bf16_gemm %s%s)\n",
                  nn::layer_precision(true) == nn::Precision::BF16 ? "in bf16 (vdpbf16ps, fp32 accumulation)"
                                                                   : "in fp32 on bf16 parameters",
                  j.cfg.kernels.cpu_bf16_gemm.c_str(), bf16_gemm.detail.c_str());
    std::printf("[train] data: %s: %zu training / %zu validation tokens, %lld optimizer steps per epoch\n",
                j.opts.data.empty() ? "embedded corpus" : j.opts.data.c_str(), j.train_src().size(),
                j.val_src().size(), static_cast<long long>(j.steps_per_epoch));
    if (!j.shards_note.empty()) std::printf("[train] token data: %s\n", j.shards_note.c_str());
    std::printf("[train] %d rank(s) x micro-batch %zu x %lld accumulation = %lld sequences of %lld tokens per step; "
                "steps %lld-%lld, seed %llu\n",
                dist.world_size, mb, static_cast<long long>(gas), static_cast<long long>(engine.train_batch_size()),
                static_cast<long long>(seq), static_cast<long long>(start_step + 1),
                static_cast<long long>(j.total_steps), static_cast<unsigned long long>(j.seed));
    std::fflush(stdout);
  }

  std::optional<MlpBatcher> mlp_batcher;
  if (j.spec.type == "mlp") mlp_batcher.emplace(seq, j.spec.vocab_size);
  auto to_model = [&](const Batch& b) { return mlp_batcher ? (*mlp_batcher)(b) : b; };

  // Collective: mean over ranks of sum / count.
  auto global_mean = [&](double sum, double count) {
    double buf[2] = {sum, count};
    comm.all_reduce(TensorView{buf, 2, DType::F64}, ReduceOp::Sum);
    return buf[1] > 0 ? buf[0] / buf[1] : std::nan("");
  };
  // Validation loss: the first eval_iters micro-batches of the validation split on every
  // rank (the same batches each time, so values are comparable), sample-weighted.
  auto validate = [&]() -> std::optional<double> {
    if (!val_loader) return std::nullopt;
    val_loader->sampler().set_state({});
    const auto iters = std::min<std::int64_t>(j.eval_iters, std::int64_t(val_loader->sampler().steps_per_epoch()));
    double sum = 0, count = 0;
    for (std::int64_t i = 0; i < iters; ++i) {
      Batch b = val_loader->next();
      const double n = double(b.batch);
      sum += double(engine.evaluate(to_model(b))) * n;
      count += n;
    }
    return global_mean(sum, count);
  };

  auto save = [&](std::int64_t step) {
    io::StateValue cs;
    cs["step"] = step;
    const auto s = train_loader.sampler().state();
    cs["sampler"]["epoch"] = std::int64_t(s.epoch);
    cs["sampler"]["step"] = std::int64_t(s.step);
    cs["sampler"]["global_micro_batch"] = std::int64_t(mb) * dist.world_size;
    std::ostringstream os;
    os << rng;
    cs["rng"] = os.str();
    cs["seed"] = std::int64_t(j.seed);
    cs["model"] = j.spec.describe();  // a resume compares it: n_head changes no tensor shape
    cs["data"] = data_identity_state(data_identity(j));
    const std::string tag = tag_for_step(step);
    engine.save_checkpoint(j.opts.save_dir, tag, cs);  // the engine reports it
  };

  Reporter rep(rank0, j.bar, start_step + 1, j.total_steps, tokens_per_step, j.cfg.steps_per_print,
               j.opts.loss_csv);
  std::vector<double> recent;  // losses of the last kLossWindow steps
  std::optional<double> final_val;
  if (start_step > j.total_steps && rank0) {
    // Likely a mistyped --steps: say so where warnings go, not only in the progress output.
    std::fflush(stdout);
    std::fprintf(stderr, "train: warning: the checkpoint is at step %lld, past this run's last step %lld "
                 "(--steps/--epochs): nothing to train, the checkpoint is left as it is\n",
                 static_cast<long long>(start_step), static_cast<long long>(j.total_steps));
    std::fflush(stderr);
  } else if (start_step == j.total_steps && rank0) {
    rep.note("nothing to train: the checkpoint is at step " + std::to_string(start_step) + ", the run's last step");
  }

  for (std::int64_t step = start_step + 1; step <= j.total_steps; ++step) {
    double loss_sum = 0;
    double lr = engine.get_lr();
    for (std::int64_t micro = 0; micro < gas; ++micro) {
      Batch b = to_model(train_loader.next());
      const float loss = engine.forward(b);
      loss_sum += double(loss);
      engine.backward(loss);
      if (micro + 1 == gas) lr = engine.get_lr();
      engine.step();
    }
    StepRecord r;
    r.step = step;
    r.loss = global_mean(loss_sum, double(gas));
    r.lr = lr;
    r.grad_norm = engine.get_global_grad_norm();
    r.loss_scale = engine.loss_scale();
    recent.push_back(r.loss);
    if (std::int64_t(recent.size()) > kLossWindow) recent.erase(recent.begin());
    const bool last = step == j.total_steps;
    if (last || (j.eval_interval > 0 && step % j.eval_interval == 0)) {
      r.val_loss = validate();
      if (last) final_val = r.val_loss;
    }
    rep.step(r);
    if (!j.opts.save_dir.empty() &&
        (last || (j.opts.save_interval && *j.opts.save_interval > 0 && step % *j.opts.save_interval == 0)))
      save(step);
  }
  rep.finish_bar();

  // zero_optimization.stage3_gather_16bit_weights_on_model_save: the final weights also as one
  // consolidated safetensors file beside the checkpoints (DeepSpeed's save_16bit_model).
  if (!j.opts.save_dir.empty() && j.cfg.zero_optimization.gather_16bit_weights_on_model_save &&
      j.total_steps > start_step)
    engine.save_16bit_model(j.opts.save_dir, "model.safetensors");

  // A short sample from the trained GPT, printed by rank 0. Below stage 3 rank 0 holds the
  // whole model and samples alone; at stage 3 every rank runs the sampler, because each of
  // its forward calls gathers the parameter groups from every rank.
  // Token shards hold ids of a tokenizer train does not have (without --tokenizer): no text to show.
  const bool samples_here = rank0 || engine.zero_stage() == 3;
  if (rank0 && j.generate && j.opts.sample_tokens > 0 && j.train_shards && !j.tokenizer)
    std::printf("[train] no text sample: %s holds token ids, not bytes (--tokenizer decodes them)\n",
                j.opts.data.c_str());
  if (samples_here && j.generate && j.opts.sample_tokens > 0 && (!j.train_shards || j.tokenizer)) {
    std::vector<std::int32_t> prompt;
    if (j.train_shards) {
      const data::TokenShards& src = j.val_shards->size() > 0 ? *j.val_shards : *j.train_shards;
      prompt = src.head(std::min<std::size_t>({src.size(), 32, std::size_t(seq)}));
    } else {
      const data::TextDataset& src = j.val_data.size() > 0 ? j.val_data : j.train_data;
      const auto toks = src.tokens();
      prompt.assign(toks.begin(), toks.begin() + std::ptrdiff_t(std::min<std::size_t>({toks.size(), 32, std::size_t(seq)})));
    }
    const std::size_t plen = prompt.size();
    if (!j.prompt.empty()) prompt = j.prompt;
    const std::uint64_t sample_seed = rng();
    auto out = j.generate(prompt, int(j.opts.sample_tokens), 0.8f, sample_seed);
    // Bytes are tokens, or the tokenizer's bytes ('?' for ids it does not have); control
    // bytes print as '?' either way, and UTF-8 survives with a tokenizer.
    auto text_of = [&](const std::vector<std::int32_t>& ids) {
      std::string s;
      for (auto t : ids) {
        const std::string* b = j.tokenizer ? j.tokenizer->token_bytes(t) : nullptr;
        if (b) {
          for (unsigned char c : *b) s.push_back(c < 32 && c != '\n' && c != '\t' ? '?' : char(c));
        } else {
          s += printable(std::string(1, char(!j.tokenizer && t < 256 ? t : '?')));
        }
      }
      return s;
    };
    const char* unit = j.tokenizer ? "tokens" : "bytes";
    if (rank0) {
      if (!j.prompt.empty())
        std::printf("[train] sample (temperature 0.8, prompt = --prompt, %zu %s):\n", prompt.size(), unit);
      else
        std::printf("[train] sample (temperature 0.8, prompt = first %zu %s of the validation split):\n", plen, unit);
      std::printf("%s%s\n[train] end of sample\n", text_of(prompt).c_str(), text_of(out).c_str());
    }
  }

  // With checkpoint.async_save the last save is still being written: commit it (collective)
  // before reporting success, or `latest` would name the previous tag. It prints the same
  // "saved checkpoint" line as a synchronous save.
  engine.wait_for_checkpoint();

  // Peak resident memory of the ranks (VmHWM): the largest, for the summary.
  double peak_mib = ds::peak_resident_mib().value_or(0);  // 0 where unreadable
  engine.comm().all_reduce(TensorView{&peak_mib, 1, DType::F64}, ReduceOp::Max);

  if (rank0) {
    const std::int64_t done = rep.steps_done();
    const double tps = rep.tokens_per_s();
    if (done > 0)
      std::printf("[train] done: %lld steps (%lld-%lld) in %.1f s, %lld tokens, %.0f tokens/s", static_cast<long long>(done),
                  static_cast<long long>(start_step + 1), static_cast<long long>(j.total_steps), rep.elapsed_s(),
                  static_cast<long long>(done * tokens_per_step), tps);
    else
      std::printf("[train] done: 0 steps");
    if (done > 0 && j.flops_per_token > 0) std::printf(", %.1f GFLOP/s", tps * j.flops_per_token / 1e9);
    std::printf("\n");
    if (!recent.empty()) {
      double m = 0;
      for (double x : recent) m += x;
      std::printf("[train] final train loss %.4f (mean of the last %zu steps)", m / double(recent.size()),
                  recent.size());
      if (final_val) std::printf(", final validation loss %.4f", *final_val);
      std::printf("\n");
    }
    std::printf("[train] memory per rank: model states %.1f MiB (ZeRO stage %d), peak resident %.1f MiB (largest rank)\n",
                double(engine.memory_report().total()) / (1 << 20), engine.zero_stage(), peak_mib);
    std::fflush(stdout);
  }
}

}  // namespace ds::train
