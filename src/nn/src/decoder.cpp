#include "ds/nn/decoder.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <random>
#include <string>

#include "ds/core/error.h"
#include "ds/nn/kernels.h"
#include "decoder_io.h"
#include "sampling.h"

namespace ds::nn {

Decoder::Decoder(const char* name, std::int64_t block_size, std::int64_t vocab, std::int64_t width, bool tied_head)
    : name_(name), block_size_(block_size), vocab_(vocab), width_(width), tied_head_(tied_head) {}

void Decoder::init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) {
  DS_CHECK(params.size() == ps_.infos().size(),
           name_ << "::init_parameters: expected " << ps_.infos().size() << " spans, got " << params.size());
  init_parameter_range(0, params, seed);
}

void Decoder::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  ps_.bind(params, grads);
  if (!prec_fixed_) prec_ = layer_precision(ps_.dtype() == DType::BF16);
  have_cache_ = false;
}

void Decoder::set_activation_checkpointing(bool on) {
  ckpt_ = on;
  have_cache_ = false;  // the arena is laid out again at the next forward
}

std::size_t Decoder::activation_bytes(std::int64_t B, std::int64_t T, bool checkpointing) const {
  return std::size_t(arena_floats(B * T, T, std::max(1, omp_get_max_threads()), checkpointing)) * sizeof(float);
}

float* Decoder::grow_arena(std::int64_t B, std::int64_t T) {
  const std::int64_t BT = B * T;
  const int slots = std::max(1, omp_get_max_threads());
  if (BT <= cap_bt_ && T <= cap_t_ && slots <= att_slots_ && arena_ckpt_ == ckpt_) return nullptr;
  cap_bt_ = std::max(cap_bt_, BT);
  cap_t_ = std::max(cap_t_, T);
  att_slots_ = std::max(att_slots_, slots);
  arena_ckpt_ = ckpt_;
  const std::int64_t total = arena_floats(cap_bt_, cap_t_, att_slots_, ckpt_);
  arena_ = HostBuffer();  // the old arena freed before the new one is taken
  try {
    arena_ = HostBuffer(std::size_t(total), DType::F32);
  } catch (const std::exception&) {
    // Which allocation and why, in the user's terms (the micro-batch), not "std::bad_alloc".
    DS_THROW(name_ << ": out of host memory allocating the activations of " << B << " sequences x " << T
             << " tokens (" << double(total) * 4 / double(1ull << 30)
             << " GiB); lower train_micro_batch_size_per_gpu");
  }
  return arena_.as<float>();
}

float Decoder::mean_loss(std::int64_t N) {
  return kernels::crossentropy_forward(lse_, logits_, targets_.data(), N, vocab_);
}

float Decoder::loss_forward(const Batch& batch) {
  const std::string who = std::string(name_) + "::forward";
  detail::take_batch(batch, block_size_, vocab_, who.c_str(), tokens_, targets_);
  if (mprof_) add_forward_macs(*mprof_, batch.batch, batch.seq);
  run_forward(tokens_.data(), batch.batch, batch.seq);
  ModuleTimer loss_time(mprof_, modules_.model);  // the loss is the model's own op
  return mean_loss(batch.batch * batch.seq);
}

bool Decoder::set_module_profile(ModuleProfile* profile) {
  mprof_ = profile;
  if (profile) {
    *profile = modules_.tree;
    profile->recomputes_forward = ckpt_;
  }
  return true;
}

float Decoder::forward(const Batch& batch) {
  have_cache_ = false;
  const float loss = loss_forward(batch);
  have_cache_ = true;
  cached_first_ = 0;
  cached_last_ = num_layers();
  return loss;
}

void Decoder::backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
  take_cache();
  DS_CHECK(cached_first_ == 0 && cached_last_ == num_layers(),
           name_ << "::backward: the last forward was forward_layers(" << cached_first_ << ", " << cached_last_
                 << "); its backward is backward_layers()");
  run_backward(scale, grad_ready, 0, num_layers());
}

float Decoder::evaluate(const Batch& batch) {
  have_cache_ = false;
  return loss_forward(batch);
}

void Decoder::take_cache() {
  DS_CHECK(have_cache_, name_ << "::backward: call forward() first (evaluate() and generation do not "
                                 "keep activations for backward)");
  have_cache_ = false;
}

std::vector<float> Decoder::logits_last(std::span<const std::int32_t> context) {
  have_cache_ = false;
  const std::string who = std::string(name_) + "::logits_last";
  detail::take_context(context, block_size_, vocab_, who.c_str(), tokens_);
  const std::int64_t T = std::int64_t(tokens_.size());
  run_forward(tokens_.data(), 1, T);
  const float* row = logits_ + (T - 1) * vocab_;
  return std::vector<float>(row, row + vocab_);
}

std::vector<std::int32_t> Decoder::generate(std::span<const std::int32_t> context, int n_new,
                                            float temperature, std::uint64_t seed) {
  return sample_tokens(context, n_new, temperature, seed,
                       [this](std::span<const std::int32_t> ctx) { return logits_last(ctx); });
}

std::vector<std::int32_t> sample_tokens(
    std::span<const std::int32_t> context, int n_new, float temperature, std::uint64_t seed,
    const std::function<std::vector<float>(std::span<const std::int32_t>)>& logits_last) {
  std::vector<std::int32_t> ctx(context.begin(), context.end());
  if (ctx.empty()) ctx.push_back(0);
  std::vector<std::int32_t> out;
  std::mt19937_64 rng(seed);
  for (int i = 0; i < n_new; ++i) {
    std::vector<float> l = logits_last(ctx);
    std::int32_t next = 0;
    if (temperature <= 0.0f) {
      next = std::int32_t(std::max_element(l.begin(), l.end()) - l.begin());
    } else {
      const float mx = *std::max_element(l.begin(), l.end());
      double sum = 0.0;
      for (float& v : l) { v = float(std::exp(double(v - mx) / temperature)); sum += v; }
      // Inverse-CDF sampling with a 53-bit uniform (platform-independent, unlike std:: distributions).
      const double u = double(rng() >> 11) * (1.0 / 9007199254740992.0) * sum;
      double acc = 0.0;
      next = std::int32_t(l.size() - 1);
      for (std::size_t j = 0; j < l.size(); ++j) {
        acc += l[j];
        if (u < acc) { next = std::int32_t(j); break; }
      }
    }
    out.push_back(next);
    ctx.push_back(next);
  }
  return out;
}

}  // namespace ds::nn
