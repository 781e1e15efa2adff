// What prepare() resolves and run() trains: the config, the model and its hooks, the data
// splits, the run length. Shared by the app's steps (prepare, resume, sample, summary).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "client_state_check.h"
#include "ds/config/parse.h"
#include "ds/data/dataset.h"
#include "ds/data/hdf5_dataset.h"
#include "ds/data/token_shards.h"
#include "ds/nn/model_factory.h"
#include "ds/tokenizer/bpe.h"
#include "model_spec.h"
#include "options.h"

namespace ds::train {

struct Job {
  TrainOptions opts;
  config::DsConfig cfg;  // batch sizes resolved for the world size
  ModelSpec spec;
  std::uint64_t seed = 0;
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
  // An HDF5 file's input and target arrays (feature data) instead of tokens: the datasets
  // above are then empty.
  std::optional<data::Hdf5Dataset> train_arrays, val_arrays;
  bool feature_data() const { return train_arrays.has_value(); }
  // Samples of a split: windows of block_size + 1 tokens, or the arrays' samples.
  std::size_t train_samples() const {
    return feature_data() ? train_arrays->num_samples() : train_src().num_samples(spec.block_size);
  }
  std::size_t val_samples() const {
    if (feature_data()) return val_arrays->num_samples();
    return val_src().size() > 0 ? val_src().num_samples(spec.block_size) : 0;
  }
  // What the throughput figures count per sample: its block_size tokens, or 1 for feature data.
  std::int64_t tokens_per_sample() const { return feature_data() ? 1 : spec.block_size; }
  // The unit of data_size() and of the throughput figures.
  const char* data_unit() const { return feature_data() ? "samples" : "tokens"; }
  // Tokens in the data, or samples for feature data (both splits).
  std::size_t data_size() const {
    return feature_data() ? train_samples() + val_samples() : train_src().size() + val_src().size();
  }
  // The model (module, sampler, FLOPs, checkpointing line, batch adapter) from nn::make_model.
  nn::BuiltModel model;
  // Another instance of the same model (a pipeline stage keeps one per pipe buffer).
  std::function<nn::BuiltModel()> build_another;
  // Pipeline parallelism (pipeline.stages or --pipeline_parallel_size): ranks form a stages x
  // data grid; the data is split over the data-parallel size, this rank reads its data index's.
  int stages = 1;
  int dp_size = 1, dp_rank = 0;
  bool on_gpu = false;
  std::int64_t steps_per_epoch = 0;  // optimizer steps per epoch of the training split
  std::int64_t total_steps = 0;      // the run ends after this global step
  std::int64_t eval_interval = 0;
  std::int64_t eval_iters = 0;
  bool bar = false;
  std::string identity;  // what ranks must agree on (see job_fingerprint)
  std::uint64_t data_hash = 0;
  std::optional<tokenizer::BpeTokenizer> tokenizer;  // --tokenizer
  std::vector<std::int32_t> prompt;                  // --prompt, encoded
  std::string init_from_note;  // --init_from: what rank 0 loaded (empty without the flag)
  // This rank's GPU: its local rank, modulo the visible GPUs when the ranks share them.
  int device = 0;
};

// What the run trains on, as its checkpoints record it (a resume on other data warns).
inline DataIdentity data_identity(const Job& j) {
  return {j.opts.data.empty() ? std::string("the embedded corpus") : j.opts.data,
          std::int64_t(j.data_size()), j.data_hash, j.data_unit()};
}

}  // namespace ds::train
