// PipeEngine's private state, shared by its construction (pipe_engine.cpp) and the schedule's
// execution (pipe_execute.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ds/engine/engine.h"
#include "ds/mpi/p2p.h"
#include "ds/pipe/pipe_engine.h"
#include "ds/pipe/schedule.h"
#include "pipe_slot.h"
#include "stage_module.h"
#include "tied_sync.h"

namespace ds::pipe {

struct PipeEngine::Impl {
  int stage_id = 0, stages = 1;
  int micro_batches = 1;
  StageBounds bounds;
  std::unique_ptr<StageModule> stage;
  std::shared_ptr<Communicator> data_comm, pipe_comm;
  std::unique_ptr<PeerLink> link;  // over the pipe: peer rank = stage
  std::unique_ptr<PeerLink> world_link;  // over the world (gather_model_fp32)
  std::vector<std::size_t> stage_offsets;  // dense element offset of each stage's parameters, and the total
  std::unique_ptr<Engine> engine;
  std::unique_ptr<TiedSync> tied;
  std::vector<PipeSlot> slots;

  // Per run of a schedule.
  const MicroBatchSource* source = nullptr;
  int loaded = 0;          // micro-batches taken from the source so far
  double loss_sum = 0.0;   // the last stage's forward losses
  bool training = true;

  bool first() const { return stage_id == 0; }
  bool last() const { return stage_id == stages - 1; }
  void run(const Schedule& schedule);
  void execute(const Instruction& ins);
  void ensure_loaded(PipeSlot& slot, int micro);
  void size_activations(PipeSlot& slot);
  void forward_pass(PipeSlot& slot, int buffer);
  void backward_pass(PipeSlot& slot, int buffer, int micro);
  void finish_sends();
  // The mean over the world of the last stages' loss_sum / count.
  float mean_loss(Communicator& world, int count);
};

}  // namespace ds::pipe
