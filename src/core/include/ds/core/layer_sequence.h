// A model stated as an ordered sequence of layers: what a pipeline needs to split a ds::Module
// into stages (DeepSpeed's PipelineModule over LayerSpecs). A module that can run a range of
// its layers alone implements LayerSequence beside Module (the built-in GPT and Llama do);
// layer_sequence_of() finds it.
//
// Layers, in order, own consecutive runs of parameters() that together tile it. A tied weight
// (the GPT's token embedding, which is also its LM head) is owned by its first layer and used
// by others: tied_weights() names them, so a pipeline can keep the copies of the stages that
// hold them equal by summing their gradients before the step (DeepSpeed's TiedLayerSpec).
//
// Call order, as Module::forward/backward: forward_layers(first, last) then backward_layers(),
// which undoes that forward; one range's activations are kept at a time (a forward, evaluate
// or another forward_layers drops them). Module::bind() storage is what both read and
// accumulate into, as Module::backward does. With group hooks (Module::set_group_hooks) a
// range brackets as forward/backward do, acquiring only the groups its layers use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "ds/core/module.h"

namespace ds {

struct LayerSpec {
  std::string name;       // "embed", "h.0" .. "h.{n-1}", "head": the parameter names' groups
  std::size_t first = 0;  // index of its first own parameter in parameters()
  std::size_t count = 0;  // its own parameters (a tied weight counts in its owner's)
};

// A parameter that several layers use: owned by layers.front(), read by the others.
struct TiedWeight {
  std::string name;            // the parameter's name ("wte.weight")
  std::size_t parameter = 0;   // its index in parameters()
  std::vector<std::size_t> layers;  // the layers that use it, ascending
};

class LayerSequence {
 public:
  virtual ~LayerSequence() = default;

  // The layers in execution order (at least one).
  virtual std::vector<LayerSpec> layers() const = 0;
  // Default: no tied weights.
  virtual std::vector<TiedWeight> tied_weights() const { return {}; }

  // The shape of the activation that layer `boundary` - 1 hands to layer `boundary`
  // (0 < boundary < layers().size()) for a micro-batch of batch.batch x batch.seq (the
  // decoders: {batch, seq, n_embd}, the residual stream).
  virtual std::vector<std::int64_t> activation_shape(std::size_t boundary, const Batch& batch) const = 0;

  // Runs layers [first, last) (first < last <= layers().size()) on a micro-batch, keeping
  // what backward_layers needs. first == 0 reads batch.inputs (the token ids) and `input` is
  // empty; otherwise `input` holds the activation_shape(first) values layer first - 1
  // produced. last == layers().size() reads batch.targets and returns the mean loss with
  // `output` empty; otherwise writes the activation_shape(last) values into `output` and
  // returns 0. batch.batch and batch.seq are read always, inputs and targets only there.
  // The same values, bit for bit, as the whole model's forward() computes at those points.
  virtual float forward_layers(const Batch& batch, std::size_t first, std::size_t last, std::span<const float> input,
                               std::span<float> output) = 0;

  // The backward of the latest forward_layers: accumulates (+=) the gradients of the range's
  // parameters, tied ones included, calling grad_ready(i) once per such parameter when this
  // call's share of it is final (a tied weight: once in each range that uses it). When the
  // range ends with the loss, output_grad is empty and `scale` multiplies the loss's gradient
  // as in Module::backward; otherwise output_grad is d(scaled loss)/d(output) (the next
  // range's input_grad) and scale is not used. first > 0: writes d(scaled loss)/d(input)
  // into input_grad (activation_shape(first) values); first == 0: input_grad is empty.
  // Ranges run in sequence over the whole model, last to first, accumulate the same gradient
  // bits as Module::backward, except a tied weight's where the cut separates its users (its
  // two shares are summed in another order, as a pipeline sums them).
  virtual void backward_layers(float scale, std::span<const float> output_grad, std::span<float> input_grad,
                               const std::function<void(std::size_t)>& grad_ready) = 0;
};

// The module's LayerSequence side, or null when it has none.
inline LayerSequence* layer_sequence_of(Module& module) { return dynamic_cast<LayerSequence*>(&module); }

}  // namespace ds
