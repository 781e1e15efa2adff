// Loading a TorchScript file and checking forward's signature against the contract
// (ds/torch/torch_module.h), so a wrong file fails at load with its name, not mid-training;
// forward's arity says which of the two forms it is (loss or logits).
#include <torch/version.h>

#include <filesystem>
#include <sstream>

#include "torch_call.h"
#include "torch_impl.h"

namespace ds::torch {

namespace detail {

std::string torch_message(const std::string& what) {
  std::string msg = what;
  const auto last = msg.rfind("RuntimeError: ");
  if (last != std::string::npos) msg = msg.substr(last + 14);
  const auto eol = msg.find('\n');
  if (eol != std::string::npos) msg.resize(eol);
  return msg;
}

}  // namespace detail

namespace {

std::string signature(const c10::FunctionSchema& schema) {
  std::ostringstream os;
  os << schema;
  return os.str();
}

}  // namespace

LoadedModule load_checked(const std::string& path) {
  DS_CHECK(std::filesystem::is_regular_file(path), "TorchScript model " << path << " does not exist");
  LoadedModule loaded;
  try {
    loaded.module = ::torch::jit::load(path);
  } catch (const std::exception& e) {
    DS_THROW(path << " is not a TorchScript module (save one with torch.jit.script(model).save(path)): "
                  << detail::torch_message(e.what()));
  }
  const auto method = loaded.module.find_method("forward");
  DS_CHECK(method, path << ": the module has no forward method");
  const c10::FunctionSchema& schema = method->function().getSchema();
  const auto& args = schema.arguments();  // self first
  bool ok = (args.size() == 2 || args.size() == 3) && schema.returns().size() == 1;
  for (std::size_t i = 1; ok && i < args.size(); ++i) ok = args[i].type()->kind() == c10::TypeKind::TensorType;
  ok = ok && schema.returns()[0].type()->kind() == c10::TypeKind::TensorType;
  DS_CHECK(ok, path << ": forward must be forward(self, inputs: Tensor, targets: Tensor) -> Tensor (the loss) or "
                       "forward(self, inputs: Tensor) -> Tensor (the logits), got "
                    << signature(schema));
  loaded.returns_logits = args.size() == 2;
  return loaded;
}

std::string libtorch_version() { return TORCH_VERSION; }

}  // namespace ds::torch
