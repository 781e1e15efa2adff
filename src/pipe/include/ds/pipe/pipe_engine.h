// The pipeline engine: DeepSpeed's PipelineEngine (runtime/pipe/engine.py) over a
// layer-sequence model (ds/core/layer_sequence.h) on a pipe x data rank grid.
//
//   ds::pipe::PipeEngine pipe(cfg, make_model, MPI_COMM_WORLD);   // cfg.pipeline.stages > 1
//   for (each step) loss = pipe.train_batch(next_micro_batch);     // one optimizer step
//
// Each rank runs one stage (ds/pipe/topology.h: rank = stage x data_parallel_size + data) with
// its own ds::Engine over the stage's data-parallel group: ZeRO 0-2, offload, fp32/bf16/fp16,
// gradient accumulation and clipping are that engine's. The stages execute DeepSpeed's
// TrainSchedule (1F1B) and InferenceSchedule (ds/pipe/schedule.h) instruction by
// instruction; activations and their gradients travel between neighbouring stages over MPI
// point-to-point (sends non-blocking). Across the stages of a pipe the engine agrees one skip
// decision per step and clips by the norm over all stages (ds::PipelineStage); a weight tied
// across stages (the GPT's embedding and head) is kept by its first stage, which receives the
// other stages' gradient for it every micro-batch and sends them its values after each step.
//
// Contract: construction, train_batch and eval_batch are collective over the world: every
// rank calls them in the same order. Every rank of one pipe must be handed the same
// micro-batches (those of its data index); the first stage reads the inputs, the last the
// targets, every stage the batch shape. One thread.
#pragma once

#include <mpi.h>

#include <functional>
#include <optional>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include "ds/config/ds_config.h"
#include "ds/core/module.h"
#include "ds/engine/engine.h"
#include "ds/mpi/mpi_comm.h"
#include "ds/pipe/partition.h"
#include "ds/pipe/topology.h"

namespace ds::pipe {

// Makes one instance of the model (the stage keeps one per pipe buffer; they share storage).
using ModelFactory = std::function<std::unique_ptr<Module>()>;
// Returns the next micro-batch of this rank's data index; the memory it points at must stay
// valid until the next call.
using MicroBatchSource = std::function<Batch()>;

class PipeEngine {
 public:
  // Collective over `world`: the grid of cfg.pipeline.stages, the layers split by
  // cfg.pipeline.partition_method, this rank's stage and its engine. Throws ds::Error (on
  // every rank) for a grid or batch that does not divide, a model that is not a layer
  // sequence, or a GPU model. `initial_values` (optional, outliving the constructor): a module
  // of the same parameters whose init_parameters gives the initial weights of the whole model
  // (weights from a file); without it the instances initialise their own.
  PipeEngine(config::DsConfig cfg, const ModelFactory& make_model, MPI_Comm world, Module* initial_values = nullptr);
  ~PipeEngine();
  PipeEngine(const PipeEngine&) = delete;
  PipeEngine& operator=(const PipeEngine&) = delete;

  // One optimizer step over gradient_accumulation_steps micro-batches from `next`; returns
  // the mean loss over the step's micro-batches and data-parallel ranks (on every rank).
  float train_batch(const MicroBatchSource& next);
  // Forward passes over `micro_batches` micro-batches (DeepSpeed's eval_batch); the mean
  // loss on every rank. No gradients, no counters.
  float eval_batch(const MicroBatchSource& next, int micro_batches);

  // Checkpoints of the whole model (collective over the world): Engine::save_checkpoint /
  // load_checkpoint's layout and options. Each rank writes its stage's share; the checkpoint
  // records the grid and loads on any grid, or in a data-parallel run (and a data-parallel
  // run's checkpoint loads here).
  void save_checkpoint(const std::string& save_dir, std::optional<std::string> tag = std::nullopt,
                       const io::StateValue& client_state = io::StateValue());
  std::optional<std::pair<std::string, io::StateValue>> load_checkpoint(const std::string& load_dir,
                                                                        std::optional<std::string> tag = std::nullopt,
                                                                        const LoadOptions& options = LoadOptions());

  // Collective over the world: the whole model's current weights in fp32 (flat, in the
  // model's parameters() order) on world rank 0, empty elsewhere -- for a sample or an export
  // at the end of training.
  std::vector<float> gather_model_fp32() const;

  // This stage's engine: counters, lr, loss scale, grad norm, memory report, timers.
  Engine& engine() const;
  const PipeGrid& grid() const { return grid_; }
  GridCoord coord() const { return coord_; }
  // Stage boundaries over the model's layers (ds/pipe/partition.h) and the layers' names.
  const StageBounds& bounds() const { return bounds_; }
  const std::vector<std::string>& layer_names() const { return layer_names_; }
  // "stage 0: embed .. h.1 | stage 1: h.2 .. head"
  std::string describe_stages() const;
  bool is_first_stage() const { return coord_.stage == 0; }
  bool is_last_stage() const { return coord_.stage == grid_.stages() - 1; }
  // The world communicator (all ranks), the stage's data-parallel group, this rank's pipe.
  Communicator& world_comm() const { return *world_comm_; }

 private:
  struct Impl;
  std::shared_ptr<MpiComm> world_comm_;  // first: the grid is sized from it
  PipeGrid grid_;
  GridCoord coord_;
  StageBounds bounds_;
  std::vector<std::string> layer_names_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ds::pipe
