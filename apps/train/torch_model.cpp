#include "torch_model.h"

#include "ds/core/error.h"
#if DS_TRAIN_HAVE_TORCH
#include "ds/torch/torch_module.h"
#endif

namespace ds::train {

bool torchscript_on_gpu(const std::string& device_flag) {
  DS_CHECK(device_flag != "cuda", "--device cuda: a TorchScript model trains on the CPU; use --device cpu or auto");
  return false;
}

nn::BuiltModel make_torchscript_model(const nn::ModelSpec& spec, const nn::ModelCheckpointing& checkpointing) {
  const std::string path = spec.type.substr(std::string(kTorchScriptPrefix).size());
#if DS_TRAIN_HAVE_TORCH
  nn::BuiltModel b;
  b.module = std::make_unique<torch::TorchModule>(path);
  if (checkpointing.enabled)
    b.checkpointing_note = [] { return std::string("no effect on a TorchScript model (it runs as scripted)"); };
  return b;
#else
  (void)checkpointing;
  DS_THROW("--model torchscript:" << path << ": this train was built without PyTorch support; install libtorch-dev "
                                  "(or point Torch_DIR at a libtorch) and rebuild with -DDS_WITH_TORCH=ON");
#endif
}

}  // namespace ds::train
