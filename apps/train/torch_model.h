// --model torchscript:PATH: a TorchScript module (ds/torch/torch_module.h) as the train app's
// model. The model spec's type holds the whole "torchscript:PATH"; this build may lack the
// PyTorch adapter (DS_WITH_TORCH), and then building one is an error that says so.
#pragma once

#include <string>

#include "ds/nn/model_factory.h"

namespace ds::train {

inline constexpr const char* kTorchScriptPrefix = "torchscript:";

// Whether `model_type` names a TorchScript file ("torchscript:" and a path after it).
inline bool is_torchscript(const std::string& model_type) {
  const std::string prefix = kTorchScriptPrefix;
  return model_type.size() > prefix.size() && model_type.compare(0, prefix.size(), prefix) == 0;
}

// --device for a TorchScript model: the adapter trains on the CPU (auto and cpu: false);
// cuda is an error that says so.
bool torchscript_on_gpu(const std::string& device_flag);

// The module for spec.type "torchscript:PATH": no sampler and no FLOPs count (the module's
// arithmetic is its own); checkpointing_note says activation checkpointing has no effect.
// Throws ds::Error naming the file (see TorchModule), or when this train has no torch support.
nn::BuiltModel make_torchscript_model(const nn::ModelSpec& spec, const nn::ModelCheckpointing& checkpointing);

}  // namespace ds::train
