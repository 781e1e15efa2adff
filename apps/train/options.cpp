#include "options.h"

#include <CLI/CLI.hpp>

#include "ds/engine/args.h"
#include "torch_model.h"

namespace ds::train {

namespace {

// An option bound to std::optional<T>: set only when the flag is given.
template <typename T>
CLI::Option* add_optional(CLI::App& app, const std::string& name, std::optional<T>& target,
                          const std::string& help) {
  return app.add_option_function<T>(name, [&target](const T& v) { target = v; }, help);
}

// The model's shape: --model and its sizes (checked again with the config's model section).
void add_model_flags(CLI::App& app, TrainOptions& o) {
  add_optional(app, "--model", o.model,
               "Model: gpt (default), mlp, llama (its GPU model: --device cuda only, not yet run on a GPU), or "
               "torchscript:PATH (a TorchScript module whose forward returns the loss)")
      ->check(CLI::Validator(
          [](std::string& v) {
            const bool ok = v == "gpt" || v == "mlp" || v == "llama" || is_torchscript(v);
            return ok ? std::string() : "must be gpt, mlp, llama or torchscript:PATH, got " + v;
          },
          "gpt|mlp|llama|torchscript:PATH"));
  add_optional(app, "--n_layer", o.n_layer, "Transformer blocks (GPT) / hidden layers (MLP)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1024}));
  add_optional(app, "--n_head", o.n_head, "Attention heads (GPT)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1024}));
  add_optional(app, "--n_embd", o.n_embd, "Embedding / hidden width")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  add_optional(app, "--n_kv_head", o.n_kv_head, "Key/value heads (llama; default n_head)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1024}));
  add_optional(app, "--intermediate_size", o.intermediate_size, "SwiGLU MLP width (llama; default: from n_embd)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 24));
  // Checked with the model section (model_spec.cpp): one message names the flag and the key.
  add_optional(app, "--rope_theta", o.rope_theta, "Rotary embedding base (llama; default 10000)");
  add_optional(app, "--rms_norm_eps", o.rms_norm_eps, "RMSNorm epsilon (llama; default 1e-5)");
  app.add_option_function<std::string>(
         "--tie_embeddings", [&o](const std::string& v) { o.tie_embeddings = v == "true"; },
         "true: the LM head reuses the token embedding (no lm_head.weight); false (default): its own (llama)")
      ->check(CLI::IsMember({"true", "false"}));
  add_optional(app, "--block_size", o.block_size, "Context length in tokens (bytes)")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--pipeline_parallel_size", o.pipeline_parallel_size,
                 "Pipeline stages (the config's pipeline.stages); the ranks form a stages x data grid (gpt, llama)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--activation_checkpointing", o.activation_checkpointing,
               "Recompute each block's activations in backward instead of keeping them (CPU gpt and llama; "
               "as the config's activation_checkpointing section)");

}

// The data and the run length.
void add_data_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--data", o.data,
                 "Training data: a text file (bytes are tokens), a DSTOKENS file, nanoGPT .bin / llm.c "
                 "shards (one file or a quoted glob such as 'dir/train_*.bin'), or an HDF5 file of arrays "
                 "(inputs and targets); default: the embedded corpus");
  app.add_option("--data_inputs", o.data_inputs, "HDF5 --data: the dataset holding the inputs (default: inputs)");
  app.add_option("--data_targets", o.data_targets, "HDF5 --data: the dataset holding the targets (default: targets)");
  app.add_option("--data_dtype", o.data_dtype,
                 "Token type of headerless (nanoGPT) token files: uint16 (default) or uint32")
      ->check(CLI::IsMember({"uint16", "uint32"}));
  auto* steps = add_optional(app, "--steps", o.steps, "Optimizer steps to run")
                    ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 40));
  auto* epochs = add_optional(app, "--epochs", o.epochs, "Epochs to run (instead of --steps)")
                     ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  steps->excludes(epochs);
  add_optional(app, "--lr", o.lr,
               "Learning rate for a config whose optimizer lr is \"auto\" (the HF Trainer's placeholder)")
      ->check(CLI::NonNegativeNumber);
  add_optional(app, "--seed", o.seed, "Seed for init, data order and sampling (default: config seed, else 1234)");
  add_optional(app, "--eval_interval", o.eval_interval, "Validation every N steps (0: only at the end)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  add_optional(app, "--eval_iters", o.eval_iters, "Validation micro-batches per rank (0: no validation)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  app.add_option("--val_fraction", o.val_fraction, "Fraction of the data held out for validation")
      ->check(CLI::Range(0.0, 0.5));

}

// Checkpoints, output and the device.
void add_run_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--save_dir", o.save_dir, "Checkpoint directory (saves at --save_interval and at the end)");
  add_optional(app, "--save_interval", o.save_interval, "Save every N steps (0: only at the end)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  app.add_option("--load_dir", o.load_dir, "Resume from this checkpoint directory");
  app.add_option("--ckpt_id", o.ckpt_id, "Checkpoint tag to load (default: <load_dir>/latest)");
  app.add_option("--init_from", o.init_from,
                 "Start from these weights: a .safetensors file or directory (Hugging Face GPT-2 / Llama "
                 "or ds_to_fp32 names) instead of the random init");

  app.add_option("--loss_csv", o.loss_csv, "Rank 0 writes step,loss,lr,grad_norm,loss_scale,val_loss here");
  app.add_option("--sample_tokens", o.sample_tokens, "Bytes of text generated at the end (0: none)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 20));
  app.add_option("--tokenizer", o.tokenizer,
                 "BPE tokenizer for the sample (directory with vocab.json + merges.txt, or tokenizer.json)");
  app.add_option("--prompt", o.prompt, "Text the sample continues (default: the validation split's first tokens)");
  app.add_option("--progress", o.progress, "auto (bar on a terminal), bar, or lines")
      ->check(CLI::IsMember({"auto", "bar", "lines"}));
  app.add_option("--device", o.device,
                 "cpu, cuda (one GPU per rank, by local rank) or auto (cuda when a GPU is visible; default)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));

}

// The rules across flags (DeepSpeed's --deepspeed_config included); returns the error or "".
std::string cross_flag_error(const CLI::App& app, const engine::DeepSpeedArgs& ds_args, TrainOptions& o) {
  const std::string& deepspeed_config = ds_args.deepspeed_config;
  if (!deepspeed_config.empty()) {
    if (!o.config.empty() && o.config != deepspeed_config) {
      return "--config '" + o.config + "' and --deepspeed_config '" + deepspeed_config +
             "' name different files; give one";
    }
    o.config = deepspeed_config;
  }
  if (o.config.empty()) {
    return "a config file is required: --config ds_config.json (or --deepspeed_config)";
  }
  if (app.count("--save_dir") > 0 && o.save_dir.empty()) {
    return "--save_dir is empty: give a checkpoint directory (or leave --save_dir out to save nothing)";
  }
  // An empty --load_dir (an unset shell variable) would start a fresh run in silence, where a
  // missing directory is an error.
  if (app.count("--load_dir") > 0 && o.load_dir.empty()) {
    return "--load_dir is empty: give the checkpoint directory to resume from (or leave --load_dir out to "
           "start a new run)";
  }
  // A resume restores the checkpoint's weights, so a start from other weights contradicts it.
  if (!o.init_from.empty() && !o.load_dir.empty()) {
    return "--init_from and --load_dir exclude each other: --load_dir resumes a run with its checkpoint's "
           "weights, --init_from starts a new one from " + o.init_from;
  }
  if (!o.load_dir.empty() && !o.ckpt_id.empty() && o.ckpt_id.find('/') != std::string::npos) {
    return "--ckpt_id '" + o.ckpt_id + "' must be a tag (a directory name inside --load_dir), not a path";
  }
  return {};
}

}  // namespace

ParseResult parse_options(int argc, const char* const* argv) {
  TrainOptions o;
  CLI::App app{
      "dstrain train: trains the built-in GPT or MLP on the embedded corpus or a data file\n"
      "with DeepSpeed's ds_config.json semantics.\n"
      "  mpirun -np N train --config ds_config.json [flags]",
      "train"};
  app.get_formatter()->column_width(34);

  app.add_option("--config", o.config, "DeepSpeed config file (ds_config.json)");
  // DeepSpeed's --deepspeed, --deepspeed_config FILE, --local_rank N (and --deepscale aliases).
  engine::DeepSpeedArgs ds_args;
  engine::add_deepspeed_args(app, ds_args);

  add_model_flags(app, o);
  add_data_flags(app, o);
  add_run_flags(app, o);

  ParseResult r;
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    r.message = app.help();
    return r;
  } catch (const CLI::CallForAllHelp&) {
    r.message = app.help("", CLI::AppFormatMode::All);
    return r;
  } catch (const CLI::ParseError& e) {
    r.message = std::string(e.what()) + " (see train --help)";
    r.exit_code = 2;
    r.message_is_error = true;
    return r;
  }

  o.deepspeed = ds_args.deepspeed;
  if (ds_args.local_rank >= 0) o.local_rank = ds_args.local_rank;
  if (std::string error = cross_flag_error(app, ds_args, o); !error.empty()) {
    r.message = std::move(error);
    r.exit_code = 2;
    r.message_is_error = true;
    return r;
  }
  r.options = std::move(o);
  return r;
}

}  // namespace ds::train
