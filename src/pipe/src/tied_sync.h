// Weights tied across the stages of a pipe (DeepSpeed's TiedLayerSpec; the GPT's embedding
// matrix, which is also its LM head). The first stage that uses a tied weight owns it: its
// engine trains it (optimizer state, checkpoint). Every other stage that uses it keeps a copy
// (StageModule's foreign storage) and after each backward sends its gradient for the
// micro-batch to the owner, which adds it just before the engine sees the weight's gradient
// (its grad_ready), so ZeRO-2's per-micro-batch reduction sees the sum too. After each
// optimizer step the owner sends the weight's values to the users. A user's backward of a
// micro-batch always precedes the owner's (stages run backward last to first), and sends
// never block, so neither exchange can deadlock.
#pragma once

#include <cstddef>
#include <vector>

#include "ds/core/layer_sequence.h"
#include "ds/mpi/p2p.h"
#include "ds/pipe/partition.h"
#include "stage_module.h"

namespace ds::pipe {

class TiedSync {
 public:
  // `stage` is this rank's stage (its pipe rank on `link`); bounds the stage boundaries.
  TiedSync(const std::vector<TiedWeight>& tied, const StageBounds& bounds, int stage, StageModule& module,
           PeerLink& link);

  // Owner: adds every user's gradient of the current micro-batch into the engine's gradient
  // of `model_index` (StageModule's before_shared_ready hook).
  void receive_gradients(std::size_t model_index);
  // User: sends the current micro-batch's gradients of the foreign tied weights to their
  // owners, then zeroes them for the next backward.
  void send_gradients();
  // Waits for the gradient sends in flight.
  void finish_sends();
  // After an optimizer step (and once at the start): owners send values, users receive them.
  void sync_values();

 private:
  struct Tie {
    std::size_t model_index = 0;
    int owner = 0;           // stage
    std::vector<int> users;  // other stages that use it
    int tag_offset = 0;      // its position in the model's tied list
  };
  std::vector<Tie> ties_;
  int stage_ = 0;
  StageModule& module_;
  PeerLink& link_;
  std::vector<char> incoming_;                  // one user's gradient, received
  std::vector<std::vector<char>> outgoing_;     // by tie: the gradient being sent
  std::vector<P2PRequest> sends_;               // by tie: its send, or values' sends
};

}  // namespace ds::pipe
