// The partition input of a layer-sequence model (ds/core/layer_sequence.h): each layer's name
// and trainable parameter count, for partition_layers (ds/pipe/partition.h).
#pragma once

#include <vector>

#include "ds/core/layer_sequence.h"
#include "ds/pipe/partition.h"

namespace ds::pipe {

// One LayerInfo per layer of `model`, in order: its name and the elements of its own
// parameters plus those of every tied weight it uses (DeepSpeed counts a TiedLayerSpec's
// parameters at each place it is built: the GPT's head counts the embedding matrix again).
// `params` is the module's parameters(). Throws ds::Error naming a layer whose parameters lie
// outside `params`.
std::vector<LayerInfo> layer_infos(const LayerSequence& model, const std::vector<ParamInfo>& params);

}  // namespace ds::pipe
