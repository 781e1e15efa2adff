// --init_from FILE.safetensors|DIR: the model starts from saved weights instead of its random
// init. The engine initializes parameters through Module::init_parameters (then broadcasts
// rank 0's values), so the model is wrapped in a Module that forwards everything and fills
// init_parameters from the file: no engine change, and every engine path (ZeRO stages,
// half precision, the GPU model) gets the weights the same way.
#pragma once

#include <memory>
#include <string>

#include "ds/core/module.h"

namespace ds::train {

// Checks the file against the model now (names, shapes, every tensor accounted for; throws
// ds::Error naming the tensor) when `read` is true, and returns the wrapper. Only the wrapper
// made with read = true (rank 0) reads the file at init; the others keep the model's own init,
// which the engine's broadcast of rank 0's values replaces. `describe` gets one line for the log.
std::unique_ptr<Module> init_from_file(std::unique_ptr<Module> model, const std::string& path, bool read,
                                       std::string* describe);

}  // namespace ds::train
