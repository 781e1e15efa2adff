// The PyTorch adapter as a plugin of the train app (libds_train_torch.so): train loads it with
// dlopen only for --model torchscript:PATH, so a run of the built-in models does not pay for
// loading libtorch (about 0.4 CPU-s per process). One C entry point; the module it returns is
// a ds::Module that train owns and deletes through the virtual destructor.
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>

#include "ds/torch/torch_module.h"

extern "C" __attribute__((visibility("default"))) ds::Module* ds_train_load_torchscript(const char* path, char* error,
                                                                                       std::size_t error_size) {
  try {
    return std::make_unique<ds::torch::TorchModule>(path).release();
  } catch (const std::exception& e) {
    std::strncpy(error, e.what(), error_size - 1);
    error[error_size - 1] = '\0';
    return nullptr;
  }
}
