// One pipe buffer of the pipeline engine: the micro-batch loaded into it (copied: the source's
// memory lasts only until its next call), the activations it received and sends, their
// gradients, and its loss.
#pragma once

#include <cstdint>
#include <vector>

#include "ds/core/module.h"
#include "ds/mpi/p2p.h"

namespace ds::pipe {

struct PipeSlot {
  int micro_batch = -1;  // which micro-batch of the current batch is loaded (-1: none)
  std::vector<std::int32_t> inputs, targets;
  std::vector<float> features, target_values;
  std::vector<std::int64_t> sample_shape, target_shape;
  Batch batch;  // views into the vectors above

  std::vector<float> act_in;    // from the previous stage (none on the first)
  std::vector<float> act_out;   // to the next stage (none on the last)
  std::vector<float> grad_in;   // d(loss)/d(act_out), from the next stage
  std::vector<float> grad_out;  // d(loss)/d(act_in), to the previous stage
  P2PRequest act_send, grad_send;  // sends in flight from act_out / grad_out
  float loss = 0.0f;               // the last stage's forward loss

  // Copies `b` and points `batch` at the copy.
  void load(const Batch& b, int micro) {
    micro_batch = micro;
    inputs.assign(b.inputs.begin(), b.inputs.end());
    targets.assign(b.targets.begin(), b.targets.end());
    features.assign(b.features.begin(), b.features.end());
    target_values.assign(b.target_values.begin(), b.target_values.end());
    sample_shape.assign(b.sample_shape.begin(), b.sample_shape.end());
    target_shape.assign(b.target_shape.begin(), b.target_shape.end());
    batch = b;
    batch.inputs = inputs;
    batch.targets = targets;
    batch.features = features;
    batch.target_values = target_values;
    batch.sample_shape = sample_shape;
    batch.target_shape = target_shape;
  }
};

}  // namespace ds::pipe
