// StageModule (stage_module.h): a stage's parameters, its buffers' model instances, and the
// storage of the tied weights it uses but does not own.
#include "stage_module.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "ds/core/error.h"

namespace ds::pipe {

// Address space for the parameters of other stages: mapped without access, so the stage's
// instances can bind a view for every parameter while a touch of another stage's one faults.
struct StageModule::Reservation {
  void* base = MAP_FAILED;
  std::size_t bytes = 0;
  explicit Reservation(std::size_t n) : bytes(std::max<std::size_t>(n, 1)) {
    base = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    DS_CHECK(base != MAP_FAILED, "pipeline stage: cannot reserve " << bytes << " bytes of address space");
  }
  ~Reservation() {
    if (base != MAP_FAILED) munmap(base, bytes);
  }
};

namespace {

bool uses_any(const TiedWeight& t, std::size_t first, std::size_t last) {
  return std::any_of(t.layers.begin(), t.layers.end(), [&](std::size_t l) { return l >= first && l < last; });
}

bool uses_outside(const TiedWeight& t, std::size_t first, std::size_t last) {
  return std::any_of(t.layers.begin(), t.layers.end(), [&](std::size_t l) { return l < first || l >= last; });
}

}  // namespace

StageModule::StageModule(std::vector<std::unique_ptr<Module>> instances, std::size_t first_layer,
                         std::size_t last_layer)
    : instances_(std::move(instances)), first_layer_(first_layer), last_layer_(last_layer) {
  DS_CHECK(!instances_.empty(), "pipeline stage: no model instance");
  for (auto& m : instances_) {
    DS_CHECK(m->device() == Device::Cpu, "pipeline parallelism runs CPU models only; this model runs on a GPU");
    LayerSequence* seq = layer_sequence_of(*m);
    DS_CHECK(seq != nullptr, "pipeline parallelism needs a model that is a layer sequence (the built-in gpt and "
                             "llama are; ds/core/layer_sequence.h); this model is not");
    seqs_.push_back(seq);
  }
  model_params_ = instances_.front()->parameters();
  layers_ = seqs_.front()->layers();
  const std::vector<LayerSpec>& layers = layers_;
  DS_CHECK(first_layer < last_layer && last_layer <= layers.size(),
           "pipeline stage: layers [" << first_layer << ", " << last_layer << ") outside the model's " << layers.size());
  first_param_ = layers[first_layer].first;
  end_param_ = layers[last_layer - 1].first + layers[last_layer - 1].count;
  for (const TiedWeight& t : seqs_.front()->tied_weights()) {
    const bool owned = t.parameter >= first_param_ && t.parameter < end_param_;
    if (!owned && uses_any(t, first_layer, last_layer)) foreign_.push_back(t.parameter);
    if (owned && uses_outside(t, first_layer, last_layer)) shared_owned_.push_back(t.parameter);
  }
  std::sort(foreign_.begin(), foreign_.end());
}

// The model's group g (its layer g) is the stage's group g - first_layer; groups of other
// stages are not the engine's here (a tied weight another stage owns is stage-local storage).
class StageModule::StageHooks : public GroupHooks {
 public:
  StageHooks(GroupHooks& engine, std::size_t first, std::size_t last) : engine_(engine), first_(first), last_(last) {}
  void acquire(std::size_t group, Pass pass) override {
    if (group >= first_ && group < last_) engine_.acquire(group - first_, pass);
  }
  void release(std::size_t group, Pass pass) noexcept override {
    if (group >= first_ && group < last_) engine_.release(group - first_, pass);
  }

 private:
  GroupHooks& engine_;
  std::size_t first_, last_;
};

StageModule::~StageModule() = default;

std::vector<ParamGroup> StageModule::parameter_groups() const {
  std::vector<ParamGroup> out;
  for (std::size_t l = first_layer_; l < last_layer_; ++l)
    out.push_back({layers_[l].name, layers_[l].first - first_param_, layers_[l].count});
  return out;
}

void StageModule::set_group_hooks(GroupHooks* hooks) {
  engine_hooks_ = hooks;
  stage_hooks_ = hooks ? std::make_unique<StageHooks>(*hooks, first_layer_, last_layer_) : nullptr;
  for (auto& m : instances_) m->set_group_hooks(stage_hooks_.get());
}

std::unique_ptr<GroupUse> StageModule::use_group_of(std::size_t model_index, Pass pass) const {
  for (std::size_t l = first_layer_; l < last_layer_; ++l)
    if (model_index >= layers_[l].first && model_index < layers_[l].first + layers_[l].count)
      return std::make_unique<GroupUse>(engine_hooks_, l - first_layer_, pass);
  DS_THROW("pipeline stage: parameter " << model_index << " is not this stage's");
}

std::vector<ParamInfo> StageModule::parameters() const {
  return {model_params_.begin() + std::ptrdiff_t(first_param_), model_params_.begin() + std::ptrdiff_t(end_param_)};
}

void StageModule::init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) {
  DS_CHECK(params.size() == end_param_ - first_param_,
           "pipeline stage: " << params.size() << " parameter spans for " << end_param_ - first_param_ << " parameters");
  Module& model = initial_values_ ? *initial_values_ : *instances_.front();
  if (!initial_values_ && model.init_parameter_range(first_param_, params, seed)) return;
  // The model initialises only as a whole: do that in scratch memory and keep the stage's share.
  std::vector<std::vector<float>> whole(model_params_.size());
  std::vector<std::span<float>> views;
  for (std::size_t i = 0; i < whole.size(); ++i) {
    whole[i].resize(model_params_[i].numel());
    views.emplace_back(whole[i]);
  }
  model.init_parameters(views, seed);
  for (std::size_t i = 0; i < params.size(); ++i)
    std::copy(whole[first_param_ + i].begin(), whole[first_param_ + i].end(), params[i].begin());
}

// The view of a foreign tied weight's buffer in `buffers` (its values or its gradient).
TensorView StageModule::foreign_view(const std::vector<HostBuffer>& buffers, std::size_t model_index) const {
  const auto at = std::size_t(std::find(foreign_.begin(), foreign_.end(), model_index) - foreign_.begin());
  DS_CHECK(at < buffers.size(), "pipeline stage: parameter " << model_index << " is not a bound foreign tied weight");
  const HostBuffer& b = buffers[at];
  return TensorView{const_cast<void*>(b.data()), b.count(), b.dtype()};
}

void StageModule::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  DS_CHECK(params.size() == end_param_ - first_param_ && grads.size() == params.size(),
           "pipeline stage: bind() with " << params.size() << " views for " << end_param_ - first_param_ << " parameters");
  params_.assign(params.begin(), params.end());
  grads_.assign(grads.begin(), grads.end());
  bind_instances(params.empty() ? DType::F32 : params[0].dtype, params, grads);
}

void StageModule::bind_instances(DType dtype, std::span<const TensorView> params, std::span<const TensorView> grads) {
  const std::size_t esize = dtype_size(dtype);
  foreign_values_.clear();
  foreign_grads_.clear();
  for (std::size_t i : foreign_) {
    foreign_values_.emplace_back(model_params_[i].numel(), dtype);
    foreign_grads_.emplace_back(model_params_[i].numel(), dtype);
  }
  std::size_t absent_bytes = 0;
  for (std::size_t i = 0; i < model_params_.size(); ++i)
    if (i < first_param_ || i >= end_param_) absent_bytes += model_params_[i].numel() * esize;
  absent_ = std::make_unique<Reservation>(absent_bytes);
  std::vector<TensorView> p(model_params_.size()), g(model_params_.size());
  std::size_t off = 0;
  for (std::size_t i = 0; i < model_params_.size(); ++i) {
    const std::size_t n = model_params_[i].numel();
    const auto f = std::find(foreign_.begin(), foreign_.end(), i);
    if (i >= first_param_ && i < end_param_) {
      p[i] = params[i - first_param_];
      g[i] = grads[i - first_param_];
    } else if (f != foreign_.end()) {
      const std::size_t at = std::size_t(f - foreign_.begin());
      p[i] = TensorView{foreign_values_[at].data(), n, dtype};
      g[i] = TensorView{foreign_grads_[at].data(), n, dtype};
    } else {
      // Parameters and gradients of other stages share the reservation: neither is touched.
      p[i] = g[i] = TensorView{static_cast<char*>(absent_->base) + off, n, dtype};
      off += n * esize;
    }
  }
  for (auto& m : instances_) m->bind(p, g);
}

void StageModule::select(int buffer, const Io& io) {
  DS_CHECK(buffer >= 0 && buffer < buffers(), "pipeline stage: buffer " << buffer << " of " << buffers());
  buffer_ = buffer;
  io_ = io;
}

float StageModule::forward(const Batch& batch) {
  return seqs_[std::size_t(buffer_)]->forward_layers(batch, first_layer_, last_layer_, io_.input, io_.output);
}

void StageModule::backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
  const auto ready = [&](std::size_t model_index) {
    if (model_index < first_param_ || model_index >= end_param_) return;  // a foreign tied weight: the pipe sends it
    if (before_shared_ready_ &&
        std::find(shared_owned_.begin(), shared_owned_.end(), model_index) != shared_owned_.end())
      before_shared_ready_(model_index);
    grad_ready(model_index - first_param_);
  };
  seqs_[std::size_t(buffer_)]->backward_layers(scale, io_.output_grad, io_.input_grad, ready);
}

}  // namespace ds::pipe
