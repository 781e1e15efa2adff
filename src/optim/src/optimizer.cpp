// The Optimizer classes: hyperparameters (OptimizerParams), state buffers, and the choice of
// kernel (fast CPU, reference or CUDA). The math lives in the kernels (ds/optim/kernels.h);
// everything CUDA behind device_step.h.
#include "ds/optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "device_step.h"
#include "ds/core/error.h"
#include "ds/optim/kernels.h"

namespace ds::optim {
namespace {

class Base : public Optimizer {
 public:
  Base(const OptimizerParams& c, Kernel k) : cfg_(c), kernel_(k) {
    DS_CHECK(k != Kernel::Cuda || device::available(),
             "optimizer " << c.type << ": the CUDA kernels were not built (dstrain "
                          "was configured without CUDA: DS_WITH_CUDA)");
  }
  // From the one list in ds/optim/params.h, which the config's descriptors read too.
  std::vector<std::string> state_names() const override { return optimizer_state_names(cfg_); }
  void init_state(std::size_t n) override {
    n_ = n;
    initialised_ = true;
    const std::size_t k = state_names().size();
    bufs_.clear();
    bufs_.reserve(k);
    for (std::size_t i = 0; i < k; ++i) bufs_.emplace_back(n, DType::F32);  // zero-filled, first-touched once
    fill_initial();
    if (kernel_ == Kernel::Cuda) {
      dev_.allocate(k, n);
      upload_state();
    }
  }
  void step(std::span<float> master, TensorView grad, TensorView working, std::span<const Segment> segments,
            const StepContext& ctx) override {
    check_step(master, grad, working, ctx);
    std::vector<float*> st(state_names().size());
    for (std::size_t i = 0; i < st.size(); ++i) st[i] = state(i);
    run(master.data(), st.data(), grad, working, n_, segments, ctx, kernel_);
  }
  void step_piece(std::span<float> master, TensorView grad, TensorView working, std::span<float* const> state,
                  const StepContext& ctx) override {
    const std::size_t n = master.size();
    DS_CHECK(state.size() == state_names().size(),
             name() << ": step_piece() with " << state.size() << " state arrays, expected " << state_names().size());
    DS_CHECK(grad.count == n, name() << ": gradient view holds " << grad.count << " elements, expected " << n);
    DS_CHECK(working.data == nullptr || working.count == n,
             name() << ": working view holds " << working.count << " elements, expected " << n);
    check_context(ctx);
    if (n == 0) return;
    run(master.data(), state.data(), grad, working, n, {}, ctx, kernel_);
  }
  std::vector<std::pair<std::string, std::span<float>>> state_tensors() override {
    std::vector<std::pair<std::string, std::span<float>>> out;
    for (std::size_t i = 0; i < bufs_.size(); ++i) out.emplace_back(state_names()[i], std::span<float>(bufs_[i].as<float>(), n_));
    return out;
  }
  void download_state() override {
    if (kernel_ == Kernel::Cuda) dev_.download(bufs_, n_);
  }
  void upload_state() override {
    if (kernel_ == Kernel::Cuda) dev_.upload(bufs_, n_);
  }

 protected:
  // The update of n elements with the given state arrays (the kernel's memory).
  virtual void run(float* master, float* const* state, TensorView grad, TensorView working, std::size_t n,
                   std::span<const Segment> segments, const StepContext& ctx, Kernel k) = 0;
  void fill_initial() {
    for (std::size_t i = 0; i < bufs_.size(); ++i) {
      const float v = initial_state_value(i);
      if (v == 0.f) continue;  // zero-filled already
      float* s = host_state(i);  // init_state uploads it for Kernel::Cuda
      for (std::size_t j = 0; j < n_; ++j) s[j] = v;
    }
  }
  // The state array the kernels update: the device copy for Kernel::Cuda.
  float* state(std::size_t i) { return kernel_ == Kernel::Cuda ? dev_[i] : bufs_[i].as<float>(); }
  float* host_state(std::size_t i) { return bufs_[i].as<float>(); }
  void check_step(std::span<float> master, const TensorView& grad, const TensorView& working, const StepContext& ctx) {
    DS_CHECK(initialised_, name() << ": step() before init_state()");
    DS_CHECK(master.size() == n_, name() << ": step() over " << master.size() << " elements, init_state() said " << n_);
    DS_CHECK(grad.count == n_, name() << ": gradient view holds " << grad.count << " elements, expected " << n_);
    DS_CHECK(working.data == nullptr || working.count == n_,
             name() << ": working view holds " << working.count << " elements, expected " << n_);
    check_context(ctx);
  }
  void check_context(const StepContext& ctx) const {
    DS_CHECK(ctx.step >= 1, name() << ": StepContext.step must be >= 1 (1-based), got " << ctx.step);
    DS_CHECK(std::isfinite(ctx.lr) && std::isfinite(ctx.grad_scale),
             name() << ": lr " << ctx.lr << " and grad_scale " << ctx.grad_scale << " must be finite");
  }
  std::array<double, 2> betas(const StepContext& ctx) const { return ctx.betas.value_or(cfg_.betas); }

  OptimizerParams cfg_;
  Kernel kernel_;
  std::size_t n_ = 0;
  bool initialised_ = false;
  std::vector<HostBuffer> bufs_;   // the state (CPU kernels), or its host copy (Kernel::Cuda)
  device::StateArrays dev_;        // Kernel::Cuda: the state on the device
};

class Adam final : public Base {
 public:
  Adam(const OptimizerParams& c, Kernel k) : Base(c, k), adamw_(c.type == "adamw" || c.adam_w_mode) {}
  std::string_view name() const override { return cfg_.type == "adamw" ? "adamw" : "adam"; }
  void run(float* master, float* const* st, TensorView grad, TensorView working, std::size_t n,
           std::span<const Segment>, const StepContext& ctx, Kernel k) override {
    const auto b = betas(ctx);
    AdamHyper h;
    h.lr = float(ctx.lr);
    h.beta1 = float(b[0]);
    h.beta2 = float(b[1]);
    h.eps = float(cfg_.eps);
    h.weight_decay = float(cfg_.weight_decay);
    // As FusedAdam: 1 - beta^step in double, rounded to float (beta as float).
    h.bc1 = cfg_.bias_correction ? float(1.0 - std::pow(double(h.beta1), double(ctx.step))) : 1.f;
    h.bc2 = cfg_.bias_correction ? float(1.0 - std::pow(double(h.beta2), double(ctx.step))) : 1.f;
    h.adam_w_mode = adamw_;
    h.grad_scale = float(ctx.grad_scale);
    if (k == Kernel::Cuda) return device::adam(master, st[0], st[1], grad, working, n, h, ctx);
    (k == Kernel::Cpu ? adam_cpu : adam_ref)(master, st[0], st[1], grad, working, n, h);
  }

 private:
  bool adamw_;
};

class Sgd final : public Base {
 public:
  using Base::Base;
  std::string_view name() const override { return "sgd"; }
  void run(float* master, float* const* st, TensorView grad, TensorView working, std::size_t n,
           std::span<const Segment>, const StepContext& ctx, Kernel k) override {
    SgdHyper h;
    h.lr = float(ctx.lr);
    h.momentum = float(cfg_.momentum);
    h.dampening = float(cfg_.dampening);
    h.weight_decay = float(cfg_.weight_decay);
    h.nesterov = cfg_.nesterov;
    h.first_step = ctx.step == 1;  // torch: momentum_buffer is None on the first step
    h.grad_scale = float(ctx.grad_scale);
    float* buf = cfg_.momentum != 0.0 ? st[0] : nullptr;
    if (k == Kernel::Cuda) return device::sgd(master, buf, grad, working, n, h, ctx);
    (k == Kernel::Cpu ? sgd_cpu : sgd_ref)(master, buf, grad, working, n, h);
  }
};

class Adagrad final : public Base {
 public:
  using Base::Base;
  std::string_view name() const override { return "adagrad"; }
  void run(float* master, float* const* st, TensorView grad, TensorView working, std::size_t n,
           std::span<const Segment>, const StepContext& ctx, Kernel k) override {
    AdagradHyper h;
    h.clr = float(ctx.lr / (1.0 + double(ctx.step - 1) * cfg_.lr_decay));
    h.eps = float(cfg_.eps);
    h.weight_decay = float(cfg_.weight_decay);
    h.grad_scale = float(ctx.grad_scale);
    if (k == Kernel::Cuda) return device::adagrad(master, st[0], grad, working, n, h, ctx);
    (k == Kernel::Cpu ? adagrad_cpu : adagrad_ref)(master, st[0], grad, working, n, h);
  }
  float initial_state_value(std::size_t) const override { return float(cfg_.initial_accumulator_value); }
};

class Lamb final : public Base {
 public:
  using Base::Base;
  std::string_view name() const override { return "lamb"; }
  void step_piece(std::span<float>, TensorView, TensorView, std::span<float* const>, const StepContext&) override {
    throw Error("lamb: its trust ratio needs whole parameter tensors, so it cannot step a partition piece by "
                "piece (NVMe offload); use adam, adamw, sgd or adagrad");
  }
  void run(float* master, float* const* st, TensorView grad, TensorView working, std::size_t n,
           std::span<const Segment> segments, const StepContext& ctx, Kernel k) override {
    const auto b = betas(ctx);
    LambHyper h;
    h.beta1 = float(b[0]);
    h.beta2 = float(b[1]);
    // FusedLamb: step_size = lr * sqrt(1 - beta2^t) / (1 - beta1^t), or lr.
    if (cfg_.bias_correction) {
      const double bc1 = 1.0 - std::pow(double(h.beta1), double(ctx.step));
      const double bc2 = 1.0 - std::pow(double(h.beta2), double(ctx.step));
      h.step_size = float(ctx.lr * std::sqrt(bc2) / bc1);
    } else {
      h.step_size = float(ctx.lr);
    }
    h.eps = float(cfg_.eps);
    h.weight_decay = float(cfg_.weight_decay);
    h.min_coeff = float(cfg_.min_coeff);
    h.max_coeff = float(cfg_.max_coeff);
    h.eps_inside_sqrt = cfg_.eps_inside_sqrt;
    h.grad_scale = float(ctx.grad_scale);
    if (k == Kernel::Cuda) return device_.step(master, st[0], st[1], grad, working, n, segments, h, ctx);
    coeffs_.assign(segments.empty() ? 1 : segments.size(), 1.f);
    (k == Kernel::Cpu ? lamb_cpu : lamb_ref)(master, st[0], st[1], grad, working, n, segments, h, coeffs_);
  }
  std::span<const float> last_lamb_coeffs() const override { return coeffs_; }

 private:
  std::vector<float> coeffs_;
  device::Lamb device_;  // Kernel::Cuda: its plan per segment layout
};

void check_range(bool ok, const char* key, double v, const char* want) {
  DS_CHECK(ok, "optimizer.params." << key << " must be " << want << ", got " << v);
}

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerParams& c, Kernel kernel) {
  check_range(std::isfinite(c.lr) && c.lr >= 0, "lr", c.lr, "a finite number >= 0");
  check_range(std::isfinite(c.weight_decay) && c.weight_decay >= 0, "weight_decay", c.weight_decay, "a finite number >= 0");
  check_range(std::isfinite(c.eps) && c.eps >= 0, "eps", c.eps, "a finite number >= 0");
  const std::string& t = c.type;
  if (t == "adam" || t == "adamw" || t == "lamb") {
    for (int i = 0; i < 2; ++i)
      DS_CHECK(c.betas[i] >= 0 && c.betas[i] < 1,
               "optimizer.params.betas[" << i << "] must be in [0, 1), got " << c.betas[i]);
    if (t == "lamb") {
      DS_CHECK(c.min_coeff >= 0 && c.min_coeff <= c.max_coeff,
               "optimizer.params.min_coeff (" << c.min_coeff << ") and max_coeff (" << c.max_coeff
                                              << ") must satisfy 0 <= min_coeff <= max_coeff");
      return std::make_unique<Lamb>(c, kernel);
    }
    return std::make_unique<Adam>(c, kernel);
  }
  if (t == "sgd") {
    check_range(std::isfinite(c.momentum) && c.momentum >= 0, "momentum", c.momentum, "a finite number >= 0");
    check_range(std::isfinite(c.dampening), "dampening", c.dampening, "a finite number");
    DS_CHECK(!c.nesterov || (c.momentum > 0 && c.dampening == 0),
             "optimizer.params.nesterov requires momentum > 0 and dampening = 0 (got momentum "
                 << c.momentum << ", dampening " << c.dampening << ")");
    return std::make_unique<Sgd>(c, kernel);
  }
  if (t == "adagrad") {
    check_range(std::isfinite(c.lr_decay) && c.lr_decay >= 0, "lr_decay", c.lr_decay, "a finite number >= 0");
    check_range(std::isfinite(c.initial_accumulator_value) && c.initial_accumulator_value >= 0,
                "initial_accumulator_value", c.initial_accumulator_value, "a finite number >= 0");
    return std::make_unique<Adagrad>(c, kernel);
  }
  DS_THROW("optimizer.type \"" << t << "\" is not supported; use Adam, AdamW, SGD, Adagrad or Lamb");
}

}  // namespace ds::optim
