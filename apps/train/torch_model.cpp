// --model torchscript:PATH through the adapter plugin (torch_plugin.cpp), loaded on first use:
// from train's own directory (the build tree) or DS_TRAIN_PLUGIN_DIR relative to it (an
// installed train: <prefix>/bin/../lib/dstrain).
#include "torch_model.h"

#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "ds/core/error.h"

namespace ds::train {

namespace {

constexpr const char* kPluginName = "libds_train_torch.so";
using LoadFn = Module* (*)(const char* path, char* error, std::size_t error_size);

// The plugin's entry point; ds::Error naming where it looked when it is not there.
LoadFn load_plugin() {
  static LoadFn fn = nullptr;
  if (fn) return fn;
  const std::filesystem::path exe_dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  const std::vector<std::filesystem::path> places{exe_dir / kPluginName,
                                                  exe_dir / DS_TRAIN_PLUGIN_DIR / kPluginName};
  std::string tried;
  for (const auto& p : places) {
    if (!std::filesystem::exists(p)) {
      tried += (tried.empty() ? "" : ", ") + p.string();
      continue;
    }
    void* handle = dlopen(p.c_str(), RTLD_NOW | RTLD_LOCAL);
    DS_CHECK(handle != nullptr, "--model torchscript: cannot load the PyTorch adapter " << p.string() << ": " << dlerror());
    fn = reinterpret_cast<LoadFn>(dlsym(handle, "ds_train_load_torchscript"));
    DS_CHECK(fn != nullptr, "--model torchscript: " << p.string() << " has no ds_train_load_torchscript");
    return fn;
  }
  DS_THROW("--model torchscript: the PyTorch adapter " << kPluginName << " is not installed beside train (looked for "
                                                       << tried << ")");
}

}  // namespace

bool torchscript_on_gpu(const std::string& device_flag) {
  DS_CHECK(device_flag != "cuda", "--device cuda: a TorchScript model trains on the CPU; use --device cpu or auto");
  return false;
}

nn::BuiltModel make_torchscript_model(const nn::ModelSpec& spec, const nn::ModelCheckpointing& checkpointing) {
  const std::string path = spec.type.substr(std::string(kTorchScriptPrefix).size());
#if DS_TRAIN_HAVE_TORCH
  char error[4096] = {0};
  nn::BuiltModel b;
  b.module.reset(load_plugin()(path.c_str(), error, sizeof error));
  if (!b.module) throw Error(error);  // the adapter's message, naming the file and the call
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
