// Loading a TorchScript file and checking forward's signature against the contract
// (ds/torch/torch_module.h), so a wrong file fails at load with its name, not mid-training;
// forward's arity says which of the two forms it is (loss or logits).
#include <torch/version.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>

#include "torch_blocks.h"
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

// The scripted module: forward(inputs, targets) -> loss, or forward(inputs) -> logits.
class ScriptSource final : public ModelSource {
 public:
  ScriptSource(std::string path, ::torch::jit::Module module, bool returns_logits)
      : path_(std::move(path)), module_(std::move(module)), returns_logits_(returns_logits) {
    std::vector<std::string> names;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) names.push_back(p.name);
    chain_ = DS_TORCH_CALL(path_, find_block_chain(module_, !returns_logits_, names));
  }
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : module_.named_parameters(/*recurse=*/true)) out.emplace_back(p.name, p.value);
    return out;
  }
  std::vector<ParamGroup> parameter_groups() const override {
    return chain_ ? chain_->groups : std::vector<ParamGroup>{};
  }
  void to(at::ScalarType dtype) override { DS_TORCH_CALL(path_, module_.to(dtype)); }
  void train(bool on) override { DS_TORCH_CALL(path_, module_.train(on)); }
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override {
    check_targets(targets);
    std::vector<c10::IValue> args{inputs};
    if (!returns_logits_) args.emplace_back(targets);
    ::torch::jit::Module& module = module_;  // the call as errors quote it
    const c10::IValue out = DS_TORCH_CALL(path_, module.forward(std::move(args)));
    DS_CHECK(out.isTensor(), path_ << ": forward must return a tensor, got " << out.tagKind());
    return result(out.toTensor(), targets);
  }
  at::Tensor loss_by_blocks(const at::Tensor& inputs, const at::Tensor& targets, GroupHooks* hooks,
                            const BlockRan& ran) override {
    DS_CHECK(chain_, path_ << ": the model is not a sequence of blocks: it has no block-by-block forward");
    check_targets(targets);
    const at::Tensor loss_targets = returns_logits_ ? at::Tensor() : targets;
    return result(DS_TORCH_CALL(path_, run_block_chain(*chain_, inputs, loss_targets, hooks, ran)), targets);
  }

 private:
  void check_targets(const at::Tensor& targets) const {
    DS_CHECK(!returns_logits_ || !at::isFloatingType(targets.scalar_type()),
             path_ << ": forward(inputs) returns logits, which need class ids as targets; this data has float "
                      "targets: write forward(inputs, targets) returning the loss instead");
  }
  // forward's output as the loss: itself, or the cross-entropy of the logits.
  at::Tensor result(const at::Tensor& out, const at::Tensor& targets) const {
    if (!returns_logits_) return out;
    return DS_TORCH_CALL(path_, logits_loss(out, targets, path_));
  }

  std::string path_;
  ::torch::jit::Module module_;
  bool returns_logits_;  // forward(inputs) -> logits, not forward(inputs, targets) -> loss
  std::optional<BlockChain> chain_;  // forward as a sequence of blocks, where it is one
};

}  // namespace

std::unique_ptr<ModelSource> load_script(const std::string& path) {
  DS_CHECK(std::filesystem::is_regular_file(path), "TorchScript model " << path << " does not exist");
  ::torch::jit::Module module;
  try {
    module = ::torch::jit::load(path);
  } catch (const std::exception& e) {
    DS_THROW(path << " is not a TorchScript module (save one with torch.jit.script(model).save(path)): "
                  << detail::torch_message(e.what()));
  }
  const auto method = module.find_method("forward");
  DS_CHECK(method, path << ": the module has no forward method");
  const c10::FunctionSchema& schema = method->function().getSchema();
  const auto& args = schema.arguments();  // self first
  bool ok = (args.size() == 2 || args.size() == 3) && schema.returns().size() == 1;
  for (std::size_t i = 1; ok && i < args.size(); ++i) ok = args[i].type()->kind() == c10::TypeKind::TensorType;
  ok = ok && schema.returns()[0].type()->kind() == c10::TypeKind::TensorType;
  DS_CHECK(ok, path << ": forward must be forward(self, inputs: Tensor, targets: Tensor) -> Tensor (the loss) or "
                       "forward(self, inputs: Tensor) -> Tensor (the logits), got "
                    << signature(schema));
  return std::make_unique<ScriptSource>(path, std::move(module), /*returns_logits=*/args.size() == 2);
}

std::string libtorch_version() { return TORCH_VERSION; }

}  // namespace ds::torch
