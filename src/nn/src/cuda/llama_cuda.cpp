// LlamaCuda: ds::nn::Llama on a CUDA device (see ds/nn/llama_cuda.h). The forward/backward
// sequence, the grad_ready order, the group brackets and the sampler are those of
// src/nn/src/llama.cpp (Llama::layer_forward / run_layers / run_backward); keep them in step.
// The GEMMs, the block-causal attention products (over the per-head tensors qh, kh, vh), the
// bound views, the arena and the staging are DecoderCuda's (decoder_cuda.h), shared with GptCuda.
#include "ds/nn/llama_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_blocks.h"
#include "decoder_cuda.h"
#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "ds/nn/cuda_kernels.h"
#include "ds/nn/cuda_llama_kernels.h"
#include "ds/nn/llama.h"
#include "ds/nn/llama_kernels.h"

namespace ds::nn {

namespace kc = ds::nn::cuda;

struct LlamaCuda::Impl : kc::DecoderCuda {
  using LayerIdx = LlamaIndex::Layer;
  // Saved activations of one decoder layer (dt elements; rstd fp32). q and k after the rotation.
  struct LayerAct {
    void *ln1, *q, *k, *v, *att, *atty, *x1, *ln2, *gate, *up, *h;
    float *rstd1, *rstd2;
  };

  Llama cpu;  // the twin(): never bound, never run
  LlamaConfig cfg;
  Decoder& twin() override { return cpu; }
  std::int64_t hd = 0, KV = 0;
  float *d_cos = nullptr, *d_sin = nullptr;  // rotary tables [block_size, hd / 2]

  std::size_t embed = 0, normf = 0, head = 0;  // head == embed when tied
  std::vector<LayerIdx> layers;
  std::size_t final_group() const { return layers.size() + 1; }
  std::size_t head_group() const { return cfg.tie_embeddings ? 0 : final_group(); }

  // Activations, carved from DecoderCuda's arena by layout().
  std::vector<LayerAct> acts;
  std::vector<void*> resid;  // n_layer + 1 residual streams [N, C]
  void* lnf = nullptr;
  void *qh = nullptr, *kh = nullptr, *vh = nullptr, *yh = nullptr;  // [B,NH,T,hd], shared by layers
  void *dres = nullptr, *dln = nullptr, *datty = nullptr, *dyh = nullptr, *dqh = nullptr, *dkh = nullptr,
       *dvh = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dgate = nullptr, *dup = nullptr,
       *dh = nullptr, *datt = nullptr;
  float* rstdf = nullptr;

  Impl(const LlamaConfig& c, bool tf32, std::int64_t block)
      : DecoderCuda("LlamaCuda", tf32, c.vocab_size, c.block_size, block), cpu(c), cfg(cpu.config()) {}

  void init() {
    hd = cfg.n_embd / cfg.n_head;
    KV = cfg.n_kv_head * hd;
    const auto layout = llama_parameters(cfg);
    const auto infos = cpu.parameters();
    DS_CHECK(layout.size() == infos.size(), "LlamaCuda: layout has " << layout.size() << " parameters, Llama "
                                                                     << infos.size());
    for (std::size_t id = 0; id < layout.size(); ++id)
      DS_CHECK(infos[id].name == layout[id].name, "LlamaCuda: parameter " << id << " is '" << infos[id].name
                                                                          << "', the layout says '"
                                                                          << layout[id].name << "'");
    const LlamaIndex idx = llama_index(cfg, layout);
    embed = idx.embed;
    normf = idx.normf;
    head = idx.head;
    layers = idx.layers;

    open_device();
    // The CPU model's rotary tables (the same fp32 values), uploaded once.
    const std::size_t nt = std::size_t(cfg.block_size * hd / 2);
    std::vector<float> c(nt), s(nt);
    kernels::rope_tables(c.data(), s.data(), cfg.block_size, hd, cfg.rope_theta);
    DS_CUDA_CHECK(cudaMalloc(&d_cos, nt * sizeof(float)));
    DS_CUDA_CHECK(cudaMalloc(&d_sin, nt * sizeof(float)));
    DS_CUDA_CHECK(cudaMemcpy(d_cos, c.data(), nt * sizeof(float), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaMemcpy(d_sin, s.data(), nt * sizeof(float), cudaMemcpyHostToDevice));
  }

  ~Impl() {  // DecoderCuda's destructor frees the rest
    if (stream) (void)cudaStreamSynchronize(stream);
    if (d_cos) (void)cudaFree(d_cos);
    if (d_sin) (void)cudaFree(d_sin);
  }

  // ---- activations ----
  void ensure(std::int64_t Bn, std::int64_t Tn) override {
    if (!arena_fits(Bn, Tn)) grow_arena(Bn, Tn, [this](char* base) { return layout(base); });
  }

  // Carves the arena (base null: only counts). Returns the bytes needed.
  std::size_t layout(char* base) {
    const std::int64_t N = cap_bt, C = cfg.n_embd, L = cfg.n_layer, V = cfg.vocab_size, NH = cfg.n_head;
    const std::int64_t I = cfg.intermediate_size;
    const std::int64_t att = N * NH * cap_t;  // B*NH*T*T <= cap_bt*NH*cap_t
    Carve c = carve(base);
    auto te = [&](std::int64_t n) { return c.elems(n); };
    auto tf = [&](std::int64_t n) { return c.floats(n); };
    acts.assign(std::size_t(L), LayerAct{});
    for (auto& a : acts) {
      a.ln1 = te(N * C); a.q = te(N * C); a.k = te(N * KV); a.v = te(N * KV); a.att = te(att);
      a.atty = te(N * C); a.x1 = te(N * C); a.ln2 = te(N * C);
      a.gate = te(N * I); a.up = te(N * I); a.h = te(N * I);
      a.rstd1 = tf(N); a.rstd2 = tf(N);
    }
    resid.assign(std::size_t(L + 1), nullptr);
    for (auto& r : resid) r = te(N * C);
    lnf = te(N * C); logits = te(N * V);
    qh = te(N * C); kh = te(N * C); vh = te(N * C); yh = te(N * C);
    dres = te(N * C); dln = te(N * C); datty = te(N * C); dyh = te(N * C);
    dqh = te(N * C); dkh = te(N * C); dvh = te(N * C); dq = te(N * C); dk = te(N * KV); dv = te(N * KV);
    dgate = te(N * I); dup = te(N * I); dh = te(N * I); datt = te(att);
    rstdf = tf(N); lse = tf(N);
    // fp32 scratch, one kernel at a time (one stream): the embedding's V*C accumulator, the
    // RMSNorm weight-gradient partials, the fp32 row of logits_last.
    std::size_t sf = std::size_t(V * C);
    sf = std::max(sf, kc::rmsnorm_scratch_floats(N, C));
    return carve_tail(c, sf);
  }

  // Per-head q, k, v of layer a for the attention GEMMs: q split, k and v expanded (GQA).
  void heads_of(const LayerAct& a) {
    const std::int64_t NH = cfg.n_head, NKV = cfg.n_kv_head;
    kc::split_heads(qh, a.q, B, T, cfg.n_embd, NH, dt, stream);
    kc::expand_kv_heads(kh, a.k, B, T, NH, NKV, hd, dt, stream);
    kc::expand_kv_heads(vh, a.v, B, T, NH, NKV, hd, dt, stream);
  }

  // Llama::layer_forward on the device.
  void layer_forward(std::size_t l) {
    const std::int64_t N = B * T, C = cfg.n_embd, I = cfg.intermediate_size, NH = cfg.n_head, NKV = cfg.n_kv_head;
    const std::int64_t BNH = B * NH;
    const float eps = float(cfg.rms_norm_eps), att_scale = 1.0f / std::sqrt(float(hd));
    const LayerIdx& P = layers[l];
    const LayerAct& a = acts[l];
    const void* x = resid[l];
    // x1 = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))), n = rmsnorm(x)
    kc::rmsnorm_forward(a.ln1, a.rstd1, x, w[P.ln1], N, C, eps, dt, stream);
    linear_fwd(a.q, a.ln1, w[P.q], N, C, C);
    linear_fwd(a.k, a.ln1, w[P.k], N, C, KV);
    linear_fwd(a.v, a.ln1, w[P.v], N, C, KV);
    kc::rope_forward(a.q, N, T, C, NH, hd, d_cos, d_sin, dt, stream);
    kc::rope_forward(a.k, N, T, KV, NKV, hd, d_cos, d_sin, dt, stream);
    heads_of(a);
    // Block-causal: query rows [q0, q0 + nq) multiply only the keys < q0 + nq (GptCuda's path).
    const std::int64_t Bq = std::min(att_block, T);
    attention_scores(a.att, qh, kh, hd, Bq, BNH);
    kc::causal_softmax_forward_blocks(a.att, a.att, att_scale, BNH, T, Bq, dt, stream);
    attention_values(yh, a.att, vh, hd, Bq, BNH);
    kc::merge_heads(a.atty, yh, B, T, C, NH, dt, stream);
    linear_fwd(a.x1, a.atty, w[P.o], N, C, C);
    kc::add_bias_residual(a.x1, nullptr, x, N, C, dt, stream);
    // x2 = x1 + down_proj(silu(gate_proj(n)) * up_proj(n)), n = rmsnorm(x1)
    kc::rmsnorm_forward(a.ln2, a.rstd2, a.x1, w[P.ln2], N, C, eps, dt, stream);
    linear_fwd(a.gate, a.ln2, w[P.gate], N, C, I);
    linear_fwd(a.up, a.ln2, w[P.up], N, C, I);
    kc::swiglu_forward(a.h, a.gate, a.up, N * I, dt, stream);
    linear_fwd(resid[l + 1], a.h, w[P.down], N, I, C);
    kc::add_bias_residual(resid[l + 1], nullptr, a.x1, N, C, dt, stream);
  }

  // Llama::run_layers over every layer on the device; tokens already in d_tokens.
  void run_forward(std::int64_t Bn, std::int64_t Tn) override {
    const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, N = Bn * Tn;
    B = Bn;
    T = Tn;
    {
      GroupUse use(hooks, 0, Pass::Forward);
      kc::embedding_forward(resid[0], d_tokens, w[embed], nullptr, Bn, Tn, C, dt, stream);
    }
    for (std::size_t l = 0; l < layers.size(); ++l) {
      GroupUse use(hooks, l + 1, Pass::Forward);
      layer_forward(l);
    }
    GroupUse use(hooks, final_group(), Pass::Forward);
    kc::rmsnorm_forward(lnf, rstdf, resid.back(), w[normf], N, C, float(cfg.rms_norm_eps), dt, stream);
    GroupUse head_use(hooks, head_group(), Pass::Forward);  // the final group again when untied
    linear_fwd(logits, lnf, w[head], N, C, V);
  }

  // Llama::backward on the device: the same grad_ready order and brackets.
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override {
    take_cache();
    auto ready = [&](std::size_t i) {
      if (grad_ready) grad_ready(i);
    };
    const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, N = B * T, I = cfg.intermediate_size;
    const std::int64_t NH = cfg.n_head, NKV = cfg.n_kv_head, BNH = B * NH;
    const float att_scale = 1.0f / std::sqrt(float(hd));
    kc::crossentropy_backward(logits, lse, d_targets, N, V, scale, dt, stream);
    {
      GroupUse use(hooks, final_group(), Pass::Backward);
      {
        GroupUse head_use(hooks, head_group(), Pass::Backward);
        linear_dinp(dln, logits, w[head], N, C, V, 0.0f);
        linear_dw(g[head], logits, lnf, N, C, V);
        if (!cfg.tie_embeddings) ready(head);
      }
      DS_CUDA_CHECK(cudaMemsetAsync(dres, 0, std::size_t(N * C) * dtype_size(dt), stream));
      kc::rmsnorm_backward(dres, g[normf], dln, resid.back(), w[normf], rstdf, N, C, scratch, dt, stream);
      ready(normf);
    }
    for (std::size_t li = layers.size(); li-- > 0;) {
      GroupUse use(hooks, li + 1, Pass::Backward);
      const LayerIdx& P = layers[li];
      const LayerAct& a = acts[li];
      // MLP; dres holds dL/dx2.
      linear_dinp(dh, dres, w[P.down], N, I, C, 0.0f);
      linear_dw(g[P.down], dres, a.h, N, I, C);
      ready(P.down);
      kc::swiglu_backward(dgate, dup, dh, a.gate, a.up, N * I, dt, stream);
      linear_dinp(dln, dup, w[P.up], N, C, I, 0.0f);
      linear_dw(g[P.up], dup, a.ln2, N, C, I);
      ready(P.up);
      linear_dinp(dln, dgate, w[P.gate], N, C, I, 1.0f);
      linear_dw(g[P.gate], dgate, a.ln2, N, C, I);
      ready(P.gate);
      kc::rmsnorm_backward(dres, g[P.ln2], dln, a.x1, w[P.ln2], a.rstd2, N, C, scratch, dt, stream);
      ready(P.ln2);
      // Attention; dres holds dL/dx1.
      linear_dinp(datty, dres, w[P.o], N, C, C, 0.0f);
      linear_dw(g[P.o], dres, a.atty, N, C, C);
      ready(P.o);
      heads_of(a);  // the per-head q, k, v again from the saved (rotated) q, k, v
      kc::split_heads(dyh, datty, B, T, C, NH, dt, stream);
      // gpt_cuda.cpp's block-causal backward GEMMs.
      const std::int64_t Bq = std::min(att_block, T);
      attention_values_backward(datt, dvh, dyh, a.att, vh, hd, Bq, BNH);
      kc::causal_softmax_backward_blocks(datt, a.att, datt, att_scale, BNH, T, Bq, dt, stream);  // datt -> dS
      attention_scores_backward(dqh, dkh, datt, qh, kh, hd, Bq, BNH);
      kc::merge_heads(dq, dqh, B, T, C, NH, dt, stream);
      kc::reduce_kv_heads(dk, dkh, B, T, NH, NKV, hd, dt, stream);
      kc::reduce_kv_heads(dv, dvh, B, T, NH, NKV, hd, dt, stream);
      kc::rope_backward(dq, N, T, C, NH, hd, d_cos, d_sin, dt, stream);
      kc::rope_backward(dk, N, T, KV, NKV, hd, d_cos, d_sin, dt, stream);
      linear_dinp(dln, dq, w[P.q], N, C, C, 0.0f);
      linear_dw(g[P.q], dq, a.ln1, N, C, C);
      ready(P.q);
      linear_dinp(dln, dk, w[P.k], N, C, KV, 1.0f);
      linear_dw(g[P.k], dk, a.ln1, N, C, KV);
      ready(P.k);
      linear_dinp(dln, dv, w[P.v], N, C, KV, 1.0f);
      linear_dw(g[P.v], dv, a.ln1, N, C, KV);
      ready(P.v);
      kc::rmsnorm_backward(dres, g[P.ln1], dln, resid[li], w[P.ln1], a.rstd1, N, C, scratch, dt, stream);
      ready(P.ln1);
    }
    GroupUse use(hooks, 0, Pass::Backward);
    kc::embedding_backward(g[embed], nullptr, dres, d_tokens, B, T, C, V, scratch, dt, stream);
    ready(embed);
  }
};

LlamaCuda::LlamaCuda(const LlamaConfig& cfg, bool allow_tf32, std::int64_t attention_block)
    : CudaDecoder(std::make_unique<Impl>(cfg, allow_tf32, attention_block)) {
  static_cast<Impl&>(*impl_).init();  // on failure impl_'s destructor releases what init() created
}

const LlamaConfig& LlamaCuda::config() const { return static_cast<const Impl&>(*impl_).cfg; }

}  // namespace ds::nn
