#include "init_from.h"

#include <algorithm>
#include <cmath>

#include "ds/core/error.h"
#include "ds/io/hf_weights.h"
#include "ds/io/safetensors.h"

namespace ds::train {

namespace {

// NaN or Inf weights would make every step overflow and be skipped: refused at load, naming
// the file's tensor and its first bad element (in the file's layout: a transposed source's
// element is found at the transposed index).
void check_finite(const std::string& path, const io::hf::LoadPlan& plan, std::span<const ParamInfo> infos,
                  std::span<const std::span<float>> params) {
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::span<float> v = params[i];
    const auto bad = std::find_if(v.begin(), v.end(), [](float x) { return !std::isfinite(x); });
    if (bad == v.end()) continue;
    const auto k = std::size_t(bad - v.begin());
    const io::hf::LoadPlan::Source& src = plan.sources[i];
    std::size_t at = k;
    if (src.transpose) at = (k % std::size_t(src.cols)) * std::size_t(src.rows) + k / std::size_t(src.cols);
    DS_THROW("--init_from " << path << ": tensor '" << src.tensor->name << "' in " << src.tensor->file << " holds "
                            << (std::isnan(*bad) ? "NaN" : *bad > 0 ? "+Inf" : "-Inf") << " at element " << at
                            << " (parameter " << infos[i].name << " element " << k
                            << "): training from it would skip every step; the weights are damaged");
  }
}

class InitFromFile final : public Module {
 public:
  InitFromFile(std::unique_ptr<Module> inner, std::string path, bool read)
      : inner_(std::move(inner)), path_(std::move(path)), read_(read) {}

  Device device() const override { return inner_->device(); }
  void* device_stream() const override { return inner_->device_stream(); }
  std::vector<ParamInfo> parameters() const override { return inner_->parameters(); }
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override {
    if (!read_) {
      inner_->init_parameters(params, seed);
      return;
    }
    const io::SafetensorsReader file(path_);
    const auto infos = inner_->parameters();
    const io::hf::LoadPlan plan = io::hf::plan_load(file, infos);
    io::hf::load(file, plan, infos, params);
    check_finite(path_, plan, infos, params);
  }
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override {
    inner_->bind(params, grads);
  }
  float forward(const Batch& batch) override { return inner_->forward(batch); }
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override {
    inner_->backward(scale, grad_ready);
  }
  float evaluate(const Batch& batch) override { return inner_->evaluate(batch); }
  std::vector<ParamGroup> parameter_groups() const override { return inner_->parameter_groups(); }
  void set_group_hooks(GroupHooks* hooks) override { inner_->set_group_hooks(hooks); }

 private:
  std::unique_ptr<Module> inner_;
  std::string path_;
  bool read_;
};

}  // namespace

std::unique_ptr<Module> init_from_file(std::unique_ptr<Module> model, const std::string& path, bool read,
                                       std::string* describe) {
  if (read) {
    const io::SafetensorsReader file(path);
    const auto infos = model->parameters();
    const auto plan = io::hf::plan_load(file, infos);
    std::size_t n = 0;
    for (const auto& p : infos) n += p.numel();
    if (describe) {
      *describe = "--init_from " + path + ": " + std::to_string(infos.size()) + " tensors (" + std::to_string(n) +
                  " parameters) by " + plan.naming;
      if (plan.ignored) describe->append(", " + std::to_string(plan.ignored) + " buffers skipped");
    }
  }
  return std::make_unique<InitFromFile>(std::move(model), path, read);
}

}  // namespace ds::train
