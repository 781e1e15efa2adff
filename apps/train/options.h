// Command line of the `train` app: DeepSpeed's flags (--deepspeed, --deepspeed_config,
// --local_rank) plus the run, model and checkpoint flags. Parsing needs no MPI, so every rank
// parses the same argv and reaches the same verdict.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ds::train {

struct TrainOptions {
  std::string config;               // --config / --deepspeed_config
  bool deepspeed = false;           // --deepspeed: accepted (DeepSpeed scripts pass it)
  std::optional<int> local_rank;    // --local_rank N / --local_rank=N (cross-checked)

  // Model: flags override the config's "model" section, which overrides the defaults.
  std::optional<std::string> model;  // gpt | mlp | llama
  std::optional<std::int64_t> n_layer, n_head, n_embd, block_size;
  std::optional<std::int64_t> n_kv_head, intermediate_size;  // llama
  std::optional<double> rope_theta, rms_norm_eps;             // llama
  std::optional<bool> tie_embeddings;                         // llama: --tie_embeddings true|false
  std::optional<int> pipeline_parallel_size;  // DeepSpeed's pipeline.stages from the command line
  bool activation_checkpointing = false;  // as the config's activation_checkpointing section: recompute in backward

  // Data and run length.
  std::string data;                  // empty: the embedded corpus
  std::string data_dtype;            // --data_dtype uint16|uint32 (raw token files); empty: uint16
  std::string data_inputs = "inputs";    // HDF5 --data: the inputs dataset
  std::string data_targets = "targets";  // HDF5 --data: the targets dataset
  std::optional<std::int64_t> steps, epochs;
  std::optional<double> lr;  // fills an optimizer "lr": "auto" (the HF Trainer's placeholder)
  std::optional<std::uint64_t> seed;
  std::optional<std::int64_t> eval_interval, eval_iters;
  double val_fraction = 0.1;

  // Checkpoints.
  std::string save_dir;
  std::optional<std::int64_t> save_interval;
  std::string load_dir;
  std::string ckpt_id;               // tag to load (default: <load_dir>/latest) or to save under
  std::string init_from;             // safetensors file or directory the weights start from

  // Output.
  std::string loss_csv;              // rank 0 writes step,loss,lr,... per optimizer step
  std::int64_t sample_tokens = 200;  // bytes generated at the end (0: no sample)
  std::string tokenizer;             // BPE tokenizer encoding --prompt and decoding the sample
  std::string prompt;                // the sample's start (default: the validation split's first tokens)
  std::string progress = "auto";     // auto | bar | lines

  // Where the model trains: cpu, cuda (one GPU per rank, from the local rank), or auto (cuda
  // when dstrain was built with CUDA and a GPU is visible, else cpu).
  std::string device = "auto";
};

// Result of parsing: either options, or the text to print and the exit code (--help: text
// on stdout, exit 0; a bad flag: one error line, exit 2).
struct ParseResult {
  std::optional<TrainOptions> options;
  std::string message;
  int exit_code = 0;
  bool message_is_error = false;
};

ParseResult parse_options(int argc, const char* const* argv);

}  // namespace ds::train
