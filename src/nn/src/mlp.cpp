#include "ds/nn/mlp.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "ds/core/error.h"
#include "ds/nn/kernels.h"

namespace ds::nn {

namespace k = kernels;

Mlp::Mlp(const MlpConfig& cfg) : cfg_(cfg) {
  DS_CHECK(cfg.in_features > 0 && cfg.hidden > 0 && cfg.n_classes > 0 && cfg.n_hidden_layers >= 0,
           "MlpConfig: in_features, hidden, n_classes must be > 0 and n_hidden_layers >= 0");
  dims_.push_back(cfg.in_features);
  for (std::int64_t i = 0; i < cfg.n_hidden_layers; ++i) dims_.push_back(cfg.hidden);
  dims_.push_back(cfg.n_classes);
  for (std::size_t i = 0; i + 1 < dims_.size(); ++i) {
    const bool head = i + 2 == dims_.size();
    const std::string p = head ? std::string("head.") : "fc." + std::to_string(i) + ".";
    w_.push_back(ps_.add(p + "weight", {dims_[i + 1], dims_[i]}));
    b_.push_back(ps_.add(p + "bias", {dims_[i + 1]}));
  }
  modules_ = mlp_modules(cfg_, ps_.infos());
}

bool Mlp::set_module_profile(ModuleProfile* profile) {
  mprof_ = profile;
  if (profile) *profile = modules_.tree;
  return true;
}

std::vector<ParamGroup> Mlp::parameter_groups() const {
  std::vector<ParamGroup> out;
  for (std::size_t l = 0; l < w_.size(); ++l)
    out.push_back({l + 1 == w_.size() ? std::string("head") : "fc." + std::to_string(l), w_[l], 2});
  return out;
}

void Mlp::init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) {
  DS_CHECK(params.size() == ps_.size(), "Mlp::init_parameters: expected " << ps_.size() << " spans");
  for (std::size_t l = 0; l < w_.size(); ++l) {
    const float bound = 1.0f / std::sqrt(float(dims_[l]));
    DS_CHECK(params[w_[l]].size() == ps_.infos()[w_[l]].numel() &&
                 params[b_[l]].size() == ps_.infos()[b_[l]].numel(),
             "Mlp::init_parameters: wrong span size for layer " << l);
    init_uniform(params[w_[l]], bound, seed, w_[l]);
    init_uniform(params[b_[l]], bound, seed, b_[l]);
  }
}

void Mlp::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  ps_.bind(params, grads);
  have_cache_ = false;
}

namespace {
std::int64_t pad(std::int64_t n) { return (n + 15) / 16 * 16; }
}  // namespace

std::int64_t Mlp::arena_floats(std::int64_t B) const {
  const std::int64_t H = cfg_.hidden, NL = cfg_.n_hidden_layers, F = cfg_.in_features;
  const std::int64_t K = cfg_.n_classes, W = std::max({H, K, F});
  return pad(B * F) + 2 * NL * pad(B * H) + pad(B * K) + pad(B) + 2 * pad(B * W);
}

void Mlp::ensure_scratch(std::int64_t B) {
  if (B <= cap_b_) return;
  cap_b_ = B;
  const std::int64_t H = cfg_.hidden, NL = cfg_.n_hidden_layers, F = cfg_.in_features;
  const std::int64_t K = cfg_.n_classes, W = std::max({H, K, F});
  arena_ = HostBuffer(std::size_t(arena_floats(B)), DType::F32);
  float* p = arena_.as<float>();
  auto take = [&](std::int64_t n) { float* r = p; p += pad(n); return r; };
  input_ = take(B * F);
  pre_.assign(std::size_t(NL), nullptr);
  post_.assign(std::size_t(NL), nullptr);
  for (std::int64_t i = 0; i < NL; ++i) { pre_[std::size_t(i)] = take(B * H); post_[std::size_t(i)] = take(B * H); }
  logits_ = take(B * K);
  lse_ = take(B);
  dA_ = take(B * W);
  dB_ = take(B * W);
  targets_.reserve(std::size_t(B));
}

float Mlp::run(const Batch& batch) {
  const std::int64_t B = batch.batch, F = cfg_.in_features, K = cfg_.n_classes;
  DS_CHECK(B > 0, "Mlp::forward: batch must be > 0");
  DS_CHECK(batch.feature_dim == F, "Mlp::forward: feature_dim " << batch.feature_dim
                                                                << " != in_features " << F);
  DS_CHECK(batch.features.size() == std::size_t(B * F) && batch.targets.size() == std::size_t(B),
           "Mlp::forward: features must hold batch*feature_dim = " << B * F << " floats and targets "
                                                                   << B << " ids");
  if (mprof_) add_mlp_forward_macs(cfg_, modules_, B, *mprof_);
  if (!hooks_) {
    ModuleTimer t(mprof_, modules_.model);
    ps_.prepare_forward();
  }
  ensure_scratch(B);
  B_ = B;
  targets_.assign(batch.targets.begin(), batch.targets.end());
  for (std::int64_t i = 0; i < B; ++i)
    DS_CHECK(targets_[std::size_t(i)] >= 0 && targets_[std::size_t(i)] < K,
             "Mlp::forward: target " << targets_[std::size_t(i)] << " at row " << i
                                     << " outside [0, " << K << ")");
  std::memcpy(input_, batch.features.data(), std::size_t(B * F) * sizeof(float));
  const float* x = input_;
  // Layer l is group l (its weight and bias); with hooks its parameters are converted inside.
  auto use = [&](std::size_t l) {
    if (hooks_) ps_.prepare_forward(w_[l], 2);
  };
  // Each op's time to its module while the flops profiler's profile is set (module_trees.h).
  for (std::size_t l = 0; l < pre_.size(); ++l) {
    GroupUse g(hooks_, l, Pass::Forward);
    use(l);
    {
      ModuleTimer t(mprof_, modules_.fc[l]);
      k::linear_forward(pre_[l], x, ps_.w(w_[l]), ps_.w(b_[l]), nullptr, B, dims_[l], dims_[l + 1]);
    }
    ModuleTimer t(mprof_, modules_.model);
    k::gelu_forward(post_[l], pre_[l], B * dims_[l + 1]);
    x = post_[l];
  }
  const std::size_t h = w_.size() - 1;
  {
    GroupUse g(hooks_, h, Pass::Forward);
    use(h);
    ModuleTimer t(mprof_, modules_.head);
    k::linear_forward(logits_, x, ps_.w(w_[h]), ps_.w(b_[h]), nullptr, B, dims_[h], K);
  }
  ModuleTimer t(mprof_, modules_.model);
  return k::crossentropy_forward(lse_, logits_, targets_.data(), B, K);
}

float Mlp::forward(const Batch& batch) {
  have_cache_ = false;
  const float loss = run(batch);
  have_cache_ = true;
  return loss;
}

float Mlp::evaluate(const Batch& batch) {
  have_cache_ = false;
  return run(batch);
}

void Mlp::backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
  DS_CHECK(have_cache_, "Mlp::backward: call forward() first");
  have_cache_ = false;
  const std::int64_t B = B_, K = cfg_.n_classes;
  ps_.prepare_backward();
  k::crossentropy_backward(logits_, lse_, targets_.data(), B, K, scale);
  const float* dout = logits_;
  for (std::size_t l = w_.size(); l-- > 0;) {
    const float* inp = l == 0 ? input_ : post_[l - 1];
    float* dinp = l == 0 ? nullptr : (dout == dA_ ? dB_ : dA_);
    {
      GroupUse g(hooks_, l, Pass::Backward);
      k::linear_backward(dinp, ps_.g(w_[l]), ps_.g(b_[l]), dout, inp, ps_.w(w_[l]), B, dims_[l],
                         dims_[l + 1], false);
      ps_.finish_grad(w_[l], grad_ready);
      ps_.finish_grad(b_[l], grad_ready);
    }
    if (l > 0) {
      k::gelu_backward(dinp, pre_[l - 1], dinp, B * dims_[l]);
      dout = dinp;
    }
  }
}

double Mlp::flops_per_sample() const {
  double n = 0;
  for (std::size_t l = 0; l + 1 < dims_.size(); ++l) n += double(dims_[l]) * double(dims_[l + 1]);
  return 6.0 * n;
}

}  // namespace ds::nn
