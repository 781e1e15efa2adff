#include "ds/nn/llama.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "ds/core/error.h"
#include "ds/nn/kernels.h"
#include "ds/nn/llama_kernels.h"
#include "decoder_io.h"

namespace ds::nn {

namespace k = kernels;

Llama::Llama(const LlamaConfig& cfg)
    : Decoder("Llama", cfg.block_size, cfg.vocab_size, cfg.n_embd, cfg.tie_embeddings), cfg_(resolved(cfg)) {
  const std::vector<LlamaParam> layout = llama_parameters(cfg_);  // validates
  hd_ = cfg_.n_embd / cfg_.n_head;
  kv_ = cfg_.n_kv_head * hd_;
  for (const LlamaParam& p : layout) ps_.add(p.name, p.shape);
  const LlamaIndex idx = llama_index(cfg_, layout);
  embed_ = idx.embed;
  normf_ = idx.normf;
  head_ = idx.head;
  layers_ = idx.layers;
  // llama_parameters() lists the embedding, each layer's 9 matrices and norms, then the final
  // norm and head: each group is a consecutive run.
  groups_.push_back({"embed", embed_, 1});
  for (std::size_t l = 0; l < layers_.size(); ++l) groups_.push_back({"h." + std::to_string(l), layers_[l].q, 9});
  groups_.push_back({"final", normf_, cfg_.tie_embeddings ? 1u : 2u});
  rope_cos_.resize(std::size_t(cfg_.block_size * hd_ / 2));
  rope_sin_.resize(rope_cos_.size());
  k::rope_tables(rope_cos_.data(), rope_sin_.data(), cfg_.block_size, hd_, cfg_.rope_theta);
  modules_ = llama_modules(cfg_, ps_.infos());
}

// Each parameter from the seed and its own index: any range gives what the whole model does.
bool Llama::init_parameter_range(std::size_t first, std::span<const std::span<float>> params, std::uint64_t seed) {
  const auto& infos = ps_.infos();
  DS_CHECK(first + params.size() <= infos.size(),
           "Llama::init_parameter_range: parameters " << first << "+" << params.size() << " of " << infos.size());
  for (std::size_t k = 0; k < params.size(); ++k) {
    const std::size_t i = first + k;
    DS_CHECK(params[k].size() == infos[i].numel(),
             "Llama::init_parameters: '" << infos[i].name << "' needs " << infos[i].numel()
                                         << " floats, got " << params[k].size());
    if (infos[i].shape.size() == 1) init_constant(params[k], 1.0f);  // the RMSNorm weights
    else init_normal(params[k], kLlamaInitStd, seed, i);
  }
  return true;
}

std::int64_t Llama::arena_floats(std::int64_t N, std::int64_t T, int slots, bool checkpointing) const {
  const std::int64_t C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size;
  const std::int64_t KV = kv_, I = cfg_.intermediate_size, NH = cfg_.n_head;
  const std::int64_t att = N * NH * T;  // B*NH*T*T <= BT*NH*T
  const auto pad = detail::pad16;
  const std::int64_t per_layer =
      pad(N * C) * 5 + pad(N) * 2 + pad(N * KV) * 2 + pad(att) + pad(N * I) * 3;
  const std::int64_t kept = checkpointing ? 1 : L;  // checkpointing: one layer's activations
  return per_layer * kept + pad(N * C) * (L + 1) + pad(N * C) + pad(N) * 2 + pad(N * V) + pad(N * C) * 4 +
         pad(N * KV) * 2 + pad(N * I) * 3 + pad(T * T) * slots;
}

void Llama::ensure_scratch(std::int64_t B, std::int64_t T) {
  float* arena = grow_arena(B, T);
  if (!arena) return;
  detail::ArenaCarve take{arena};
  const std::int64_t N = cap_bt_, C = cfg_.n_embd, L = cfg_.n_layer, V = cfg_.vocab_size;
  const std::int64_t KV = kv_, I = cfg_.intermediate_size;
  const std::int64_t att = N * cfg_.n_head * cap_t_;
  acts_.assign(std::size_t(L), LayerAct{});
  for (std::size_t l = 0; l < (ckpt_ ? 1 : acts_.size()); ++l) {
    LayerAct& a = acts_[l];
    a.ln1 = take(N * C); a.rstd1 = take(N); a.q = take(N * C); a.k = take(N * KV); a.v = take(N * KV);
    a.att = take(att); a.atty = take(N * C); a.x1 = take(N * C); a.ln2 = take(N * C); a.rstd2 = take(N);
    a.gate = take(N * I); a.up = take(N * I); a.h = take(N * I);
  }
  if (ckpt_) std::fill(acts_.begin() + 1, acts_.end(), acts_[0]);  // every layer in one layer's space
  resid_.resize(std::size_t(L + 1));
  for (auto& r : resid_) r = take(N * C);
  lnf_ = take(N * C); rstdf_ = take(N); lse_ = take(N); logits_ = take(N * V);
  dres_ = take(N * C); dln_ = take(N * C); datty_ = take(N * C); dq_ = take(N * C);
  dk_ = take(N * KV); dv_ = take(N * KV);
  dgate_ = take(N * I); dup_ = take(N * I); dh_ = take(N * I);
  datt_scratch_ = take(cap_t_ * cap_t_ * att_slots_);
}

void Llama::prepare_group(std::size_t g) {
  if (hooks_) ps_.prepare_forward(groups_[g].first, groups_[g].count);
}

void Llama::layer_forward(std::size_t l) {
  const std::int64_t B = B_, T = T_, N = B * T, C = cfg_.n_embd, KV = kv_, I = cfg_.intermediate_size;
  const std::int64_t NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  const float eps = float(cfg_.rms_norm_eps);
  const LayerIdx& P = layers_[l];
  const LayerAct& a = acts_[l];
  const float* x = resid_[l];
  // Each op's time to its module while the flops profiler's profile is set (module_trees.h).
  const BlockModules& M = modules_.blocks[l];
  auto in = [this](int module) { return ModuleTimer(mprof_, module); };
  // x1 = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))), n = rmsnorm(x)
  { auto t = in(M.norm_1); k::rmsnorm_forward(a.ln1, a.rstd1, x, ps_.w(P.ln1), N, C, eps); }
  { auto t = in(M.q); k::linear_forward(a.q, a.ln1, ps_.w(P.q), nullptr, nullptr, N, C, C, prec_); }
  { auto t = in(M.k); k::linear_forward(a.k, a.ln1, ps_.w(P.k), nullptr, nullptr, N, C, KV, prec_); }
  { auto t = in(M.v); k::linear_forward(a.v, a.ln1, ps_.w(P.v), nullptr, nullptr, N, C, KV, prec_); }
  {
    auto t = in(M.attn);
    k::rope_forward(a.q, N, T, C, NH, hd_, rope_cos_.data(), rope_sin_.data());
    k::rope_forward(a.k, N, T, KV, NKV, hd_, rope_cos_.data(), rope_sin_.data());
    k::gqa_attention_forward(a.atty, a.att, a.q, a.k, a.v, C, KV, B, T, NH, NKV, hd_);
  }
  { auto t = in(M.attn_out); k::linear_forward(a.x1, a.atty, ps_.w(P.o), nullptr, x, N, C, C, prec_); }
  // x2 = x1 + down_proj(silu(gate_proj(n)) * up_proj(n)), n = rmsnorm(x1)
  { auto t = in(M.norm_2); k::rmsnorm_forward(a.ln2, a.rstd2, a.x1, ps_.w(P.ln2), N, C, eps); }
  { auto t = in(M.gate); k::linear_forward(a.gate, a.ln2, ps_.w(P.gate), nullptr, nullptr, N, C, I, prec_); }
  { auto t = in(M.up); k::linear_forward(a.up, a.ln2, ps_.w(P.up), nullptr, nullptr, N, C, I, prec_); }
  { auto t = in(M.mlp); k::swiglu_forward(a.h, a.gate, a.up, N * I); }
  { auto t = in(M.down); k::linear_forward(resid_[l + 1], a.h, ps_.w(P.down), nullptr, a.x1, N, I, C, prec_); }
}

void Llama::run_layers(const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::size_t first,
                       std::size_t last) {
  if (!hooks_) {
    ModuleTimer t(mprof_, modules_.model);
    prepare_layers(first, last);
  }
  ensure_scratch(B, T);
  B_ = B;
  T_ = T;
  const std::int64_t N = B * T, C = cfg_.n_embd, V = cfg_.vocab_size;
  const float eps = float(cfg_.rms_norm_eps);
  if (first == 0) {
    GroupUse use(hooks_, 0, Pass::Forward);
    prepare_group(0);
    ModuleTimer t(mprof_, modules_.embed);
    k::embedding_forward(resid_[0], tokens, ps_.w(embed_), nullptr, B, T, C);
  }
  // Layer l + 1 is block l.
  for (std::size_t l = first == 0 ? 0 : first - 1; l + 1 < std::min(last, num_layers() - 1); ++l) {
    GroupUse use(hooks_, l + 1, Pass::Forward);
    prepare_group(l + 1);
    layer_forward(l);
  }
  if (last < num_layers()) return;
  GroupUse use(hooks_, final_group(), Pass::Forward);
  prepare_group(final_group());
  { ModuleTimer t(mprof_, modules_.final_norm); k::rmsnorm_forward(lnf_, rstdf_, resid_.back(), ps_.w(normf_), N, C, eps); }
  GroupUse head(hooks_, head_group(), Pass::Forward);  // the final group again when untied
  ModuleTimer t(mprof_, modules_.head);
  k::linear_forward(logits_, lnf_, ps_.w(head_), nullptr, nullptr, N, C, V, prec_);
}

void Llama::head_backward(float scale, const std::function<void(std::size_t)>& done, bool with_embedding) {
  auto g = [&](std::size_t id) { return ps_.g(id); };
  auto w = [&](std::size_t id) { return ps_.w(id); };
  const std::int64_t N = B_ * T_, C = cfg_.n_embd, V = cfg_.vocab_size;
  // Softmax + cross-entropy gradient in place over the logits; then the LM head.
  k::crossentropy_backward(logits_, lse_, targets_.data(), N, V, scale);
  GroupUse use(hooks_, final_group(), Pass::Backward);
  {
    GroupUse head(hooks_, head_group(), Pass::Backward);
    k::linear_backward(dln_, g(head_), nullptr, logits_, lnf_, w(head_), N, C, V, false, prec_);
    // Tied: the embedding adds its share later, unless the range stops before it.
    if (!cfg_.tie_embeddings || !with_embedding) done(head_);
  }
  std::memset(dres_, 0, std::size_t(N * C) * sizeof(float));
  k::rmsnorm_backward(dres_, g(normf_), dln_, resid_.back(), w(normf_), rstdf_, N, C);
  done(normf_);
}

void Llama::run_backward(float scale, const std::function<void(std::size_t)>& grad_ready, std::size_t first,
                         std::size_t last) {
  ps_.prepare_backward();
  auto done = [&](std::size_t id) { ps_.finish_grad(id, grad_ready); };
  auto g = [&](std::size_t id) { return ps_.g(id); };
  auto w = [&](std::size_t id) { return ps_.w(id); };
  const std::int64_t B = B_, T = T_, N = B * T, C = cfg_.n_embd, KV = kv_;
  const std::int64_t I = cfg_.intermediate_size, NH = cfg_.n_head, NKV = cfg_.n_kv_head;
  if (last == num_layers()) head_backward(scale, done, first == 0);
  // Layer l + 1 is block l: blocks [b0, b1) from the last.
  const std::size_t b0 = first == 0 ? 0 : first - 1, b1 = std::min(last, num_layers() - 1) - 1;
  for (std::size_t li = b1; li-- > b0;) {
    GroupUse use(hooks_, li + 1, Pass::Backward);
    // Checkpointing: layer li's activations again from its input (the last layer's are still
    // there from the forward).
    if (ckpt_ && li + 1 < layers_.size()) layer_forward(li);
    const LayerIdx& P = layers_[li];
    const LayerAct& a = acts_[li];
    // MLP; dres holds dL/dx2.
    k::linear_backward(dh_, g(P.down), nullptr, dres_, a.h, w(P.down), N, I, C, false, prec_);
    done(P.down);
    k::swiglu_backward(dgate_, dup_, dh_, a.gate, a.up, N * I);
    k::linear_backward(dln_, g(P.up), nullptr, dup_, a.ln2, w(P.up), N, C, I, false, prec_);
    done(P.up);
    k::linear_backward(dln_, g(P.gate), nullptr, dgate_, a.ln2, w(P.gate), N, C, I, true, prec_);
    done(P.gate);
    k::rmsnorm_backward(dres_, g(P.ln2), dln_, a.x1, w(P.ln2), a.rstd2, N, C);
    done(P.ln2);
    // Attention; dres holds dL/dx1.
    k::linear_backward(datty_, g(P.o), nullptr, dres_, a.atty, w(P.o), N, C, C, false, prec_);
    done(P.o);
    k::gqa_attention_backward(dq_, dk_, dv_, datty_, a.q, a.k, a.v, C, KV, a.att, B, T, NH, NKV, hd_,
                              datt_scratch_, att_slots_);
    k::rope_backward(dq_, N, T, C, NH, hd_, rope_cos_.data(), rope_sin_.data());
    k::rope_backward(dk_, N, T, KV, NKV, hd_, rope_cos_.data(), rope_sin_.data());
    k::linear_backward(dln_, g(P.q), nullptr, dq_, a.ln1, w(P.q), N, C, C, false, prec_);
    done(P.q);
    k::linear_backward(dln_, g(P.k), nullptr, dk_, a.ln1, w(P.k), N, C, KV, true, prec_);
    done(P.k);
    k::linear_backward(dln_, g(P.v), nullptr, dv_, a.ln1, w(P.v), N, C, KV, true, prec_);
    done(P.v);
    k::rmsnorm_backward(dres_, g(P.ln1), dln_, resid_[li], w(P.ln1), a.rstd1, N, C);
    done(P.ln1);
  }
  if (first > 0) return;
  GroupUse use(hooks_, 0, Pass::Backward);
  k::embedding_backward(g(embed_), nullptr, dres_, tokens_.data(), B, T, C);
  done(embed_);
}

double Llama::flops_per_token(std::int64_t seq) const {
  const double C = double(cfg_.n_embd), L = double(cfg_.n_layer), V = double(cfg_.vocab_size);
  const double KV = double(kv_), I = double(cfg_.intermediate_size);
  const double T = double(seq > 0 ? seq : cfg_.block_size);
  const double n_matmul = L * (2.0 * C * C + 2.0 * C * KV + 3.0 * C * I) + V * C;
  return 6.0 * n_matmul + 12.0 * L * C * T;
}

}  // namespace ds::nn
