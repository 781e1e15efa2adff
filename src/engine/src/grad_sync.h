// GradSync: what the engine asks of its gradient synchronisation, whichever ZeRO stage runs
// it -- the GradReducer (stages 0-2: buckets of the flat gradients, all-reduced) or the
// GroupFetcher (stage 3: each parameter group gathered for use and its gradients
// reduce-scattered). The engine calls, per micro-batch: begin_forward, end_forward,
// begin_backward, grad_ready (from Module::backward), end_backward; at the accumulation
// boundary finish() before the step; params_changed() after an applied update or a load.
#pragma once

#include <cstddef>

namespace ds::engine {

class GradSync {
 public:
  virtual ~GradSync() = default;
  virtual void begin_forward() {}
  virtual void end_forward() {}
  // boundary: this backward is the last micro-batch of the accumulation cycle.
  virtual void begin_backward(bool boundary) = 0;
  virtual void grad_ready(std::size_t param) = 0;
  virtual void end_backward() = 0;
  // Before the step: every gradient this rank steps is reduced.
  virtual void finish() = 0;
  // This rank's parameters changed (an optimizer update, a checkpoint load): stage 3's
  // gathered copies are stale.
  virtual void params_changed() {}
  // The part of the data-parallel averaging the optimizer applies (with 1/loss_scale).
  virtual double post_factor() const = 0;
  virtual std::size_t scratch_bytes() const = 0;  // communication staging bytes held
  virtual std::size_t peak_resident() const { return 0; }
};

}  // namespace ds::engine
