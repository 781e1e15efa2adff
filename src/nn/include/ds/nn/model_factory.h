// The built-in models' one factory: make_model turns a ModelSpec into the model object for
// the CPU or the GPU, with what the train app needs besides the Module (sampler, FLOPs per
// token, activation-checkpointing line, batch adapter). It is the only place the models meet
// DS_NN_HAVE_CUDA; a new built-in model is one more branch here plus its ModelSpec type.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ds/core/module.h"
#include "ds/nn/model_spec.h"

namespace ds::nn {

// The config's kernels section as the models read it; `source` names the config file in errors.
struct ModelKernels {
  std::string attention = "auto";  // kernels.attention: auto | flash (CUDA GPT only)
  std::int64_t attention_block = 256;
  std::string cpu_bf16_gemm = "auto";  // kernels.cpu_bf16_gemm, checked here
  std::string source;
};

// Activation checkpointing as the config section or the flag asks (`from` names which, for errors).
struct ModelCheckpointing {
  bool enabled = false;
  std::string from;
  std::int64_t micro_batch = 1;  // the note's arena size is per micro-batch of this many sequences
};

struct BuiltModel {
  std::unique_ptr<Module> module;
  // Sampler (context, new tokens, temperature, seed); empty for a model that generates nothing (the MLP).
  std::function<std::vector<std::int32_t>(std::span<const std::int32_t>, int, float, std::uint64_t)> generate;
  double flops_per_token = 0;
  // The line to print for activation checkpointing; empty when it is off.
  std::function<std::string()> checkpointing_note;
  // Turns a token batch into what the model reads (the MLP's one-hot features); empty: as is.
  std::function<Batch(const Batch&)> adapt_batch;
  // Its Linear GEMMs on the CPU follow kernels.cpu_bf16_gemm (bf16 working parameters).
  bool cpu_bf16_gemm = false;
};

// --device auto | cpu | cuda for this model: whether it runs on a GPU. auto picks the GPU when
// this build has the model's GPU version and a GPU is visible; cuda without one is an error.
bool model_on_gpu(const ModelSpec& spec, const std::string& device_flag);
// "cuda:0 (NVIDIA H100 ...)" for the log line.
std::string gpu_device_name(int device);

// Throws ds::Error for a model with no GPU version on the GPU, activation checkpointing on the
// GPU and kernel settings the model cannot take. on_gpu: build on CUDA device `device` (made current).
BuiltModel make_model(const ModelSpec& spec, bool on_gpu, int device, const ModelKernels& kernels,
                      const ModelCheckpointing& checkpointing);

}  // namespace ds::nn
