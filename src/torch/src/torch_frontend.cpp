// A C++ torch::nn::Module and the user's loss function as the adapter's model source
// (ds/torch/torch_frontend.h): the views, hooks and checks are TorchModule's own.
#include "ds/torch/torch_frontend.h"

#include "torch_call.h"
#include "torch_impl.h"

namespace ds::torch {

namespace {

class FrontendSource final : public ModelSource {
 public:
  FrontendSource(std::shared_ptr<::torch::nn::Module> module, LossFn loss, std::string label)
      : module_(std::move(module)), loss_fn_(std::move(loss)), label_(std::move(label)) {}
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() override {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& p : module_->named_parameters(/*recurse=*/true)) out.emplace_back(p.key(), p.value());
    return out;
  }
  // nn::Module::to() casts with set_data(): the parameters keep their identity.
  void to(at::ScalarType dtype) override { DS_TORCH_CALL(label_, module_->to(dtype)); }
  void train(bool on) override { DS_TORCH_CALL(label_, module_->train(on)); }
  at::Tensor loss(const at::Tensor& inputs, const at::Tensor& targets) override {
    ::torch::nn::Module& module = *module_;  // the call as errors quote it
    return DS_TORCH_CALL(label_, loss_fn_(module, inputs, targets));
  }

 private:
  std::shared_ptr<::torch::nn::Module> module_;
  LossFn loss_fn_;
  std::string label_;
};

}  // namespace

struct FrontendAccess {
  static std::unique_ptr<TorchModule> make(std::unique_ptr<ModelSource> source, std::string label) {
    auto impl = std::make_unique<TorchModule::Impl>();
    impl->path = std::move(label);
    impl->source = std::move(source);
    return std::unique_ptr<TorchModule>(new TorchModule(std::move(impl)));
  }
};

std::unique_ptr<TorchModule> from_module(std::shared_ptr<::torch::nn::Module> module, LossFn loss) {
  DS_CHECK(module, "from_module: the torch::nn::Module is null");
  DS_CHECK(loss, "from_module: C++ module " << module->name() << " has no loss function");
  const std::string label = "C++ module " + module->name();
  return FrontendAccess::make(std::make_unique<FrontendSource>(std::move(module), std::move(loss), label), label);
}

}  // namespace ds::torch
