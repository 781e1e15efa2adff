// GptCuda: ds::nn::Gpt on a CUDA device (see ds/nn/gpt_cuda.h). cuBLAS for every GEMM, the
// kernels of ds/nn/cuda_kernels.h for the rest; everything on one non-blocking stream.
//
// The forward/backward sequence, the grad_ready order and the sampler are those of
// src/nn/src/gpt.cpp (Gpt::run_layers / Gpt::run_backward / Gpt::generate); keep them in step.
//
// The GEMMs (row-major tensors through column-major cuBLAS, the block-causal attention
// products), the bound views, the arena and the staging are DecoderCuda's (decoder_cuda.h),
// shared with LlamaCuda.
#include "ds/nn/gpt_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "attention_blocks.h"
#include "decoder_cuda.h"
#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "ds/nn/cuda_flash.h"
#include "ds/nn/cuda_kernels.h"

namespace ds::nn {

namespace kc = ds::nn::cuda;

struct GptCuda::Impl : kc::DecoderCuda {
  struct LayerIdx { std::size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb; };
  // Saved activations of one block (dt elements, LayerNorm statistics fp32).
  struct LayerAct {
    void *ln1, *qkv, *att, *atty, *x1, *ln2, *fch, *fch_gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float* att_lse;  // flash attention: the softmax log-sum-exp per (b, h, t); att is then null
  };

  Gpt cpu;  // the twin(): never bound, never run
  GptConfig cfg;
  Decoder& twin() override { return cpu; }

  // Parameter indices (the order of Gpt's constructor; checked against the names).
  std::size_t wte = 0, wpe = 1, lnfw = 0, lnfb = 0;
  std::vector<LayerIdx> layers;

  // Attention: the materialised path (cuBLAS batched GEMMs, block-causal, + causal softmax;
  // the default: on an H200 at the GPT-2 124M shape it ran the step faster than our flash
  // kernels, bench/results) or, with attention.flash, flash attention
  // (cuda_flash.h: no [B, NH, T, T] tensor, for long contexts; fp16 / bf16 and the head sizes
  // it supports, else the materialised path).
  GptCudaAttention attention;
  bool flash = false;
  bool use_flash() const {
    return attention.flash && dt != DType::F32 && kc::flash_attention_supported(dt, cfg.n_embd / cfg.n_head);
  }

  // Materialised path, block-causal: query blocks of att_block rows multiply only the key
  // prefix they see, so the GEMMs skip the upper block triangle of [T, T] (at T = 1024 and
  // 256-row blocks they do 10/16 of the full products) and the softmax writes zeros only
  // inside the diagonal blocks. attention.block sets the rows (256 by default; tests use
  // small blocks to cover several).

  // Activations, carved from DecoderCuda's arena by layout(); arena_flash: carved for flash.
  bool arena_flash = false;
  std::vector<LayerAct> acts;
  std::vector<void*> resid;  // n_layer + 1 residual streams [N, C]
  void* lnf = nullptr;
  void *q = nullptr, *k = nullptr, *v = nullptr, *yh = nullptr;  // [B,NH,T,hs], shared by layers
  // Backward (shared across layers).
  void *dres = nullptr, *dln = nullptr, *dfch = nullptr, *dqkv = nullptr, *datty = nullptr,
       *dyh = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *datt = nullptr;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr;

  // Per-op profile (benchmarks): when on, each op is bracketed by two events on the stream;
  // take_profile() synchronises and adds the elapsed times per op name.
  bool profiling = false;
  std::vector<cudaEvent_t> events;             // pool, reused
  std::size_t events_used = 0;
  std::vector<std::pair<const char*, std::size_t>> marks;  // op name, index of its start event
  OpProfile prof;
  struct Scope {
    Impl* m;
    std::size_t start = 0;
    const char* name;
    Scope(Impl* impl, const char* n) : m(impl->profiling ? impl : nullptr), name(n) {
      if (m) start = m->record();
    }
    ~Scope() {
      if (m) {
        m->marks.emplace_back(name, start);
        m->record();
      }
    }
  };
  std::size_t record() {
    if (events_used == events.size()) {
      cudaEvent_t e;
      DS_CUDA_CHECK(cudaEventCreate(&e));
      events.push_back(e);
    }
    DS_CUDA_CHECK(cudaEventRecord(events[events_used], stream));
    return events_used++;
  }
  void take_profile() {
    DS_CUDA_CHECK(cudaStreamSynchronize(stream));
    for (const auto& [name, i] : marks) {
      float ms = 0;
      DS_CUDA_CHECK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
      prof.add(std::string_view(name), 0.0, 1e-3 * double(ms));
    }
    marks.clear();
    events_used = 0;
  }

  Impl(const GptConfig& c, bool tf32, const GptCudaAttention& att)
      : DecoderCuda("GptCuda", tf32, c.vocab_size, c.block_size, att.block), cpu(c), cfg(c), attention(att) {}

  void init() {
    // Parameter indices, as Gpt's constructor registers them; verified by name.
    const auto infos = cpu.parameters();
    const std::size_t L = std::size_t(cfg.n_layer);
    DS_CHECK(infos.size() == 4 + 12 * L, "GptCuda: unexpected parameter count " << infos.size());
    for (std::size_t l = 0; l < L; ++l) {
      const std::size_t b = 2 + 12 * l;
      layers.push_back({b, b + 1, b + 2, b + 3, b + 4, b + 5, b + 6, b + 7, b + 8, b + 9, b + 10, b + 11});
    }
    lnfw = 2 + 12 * L;
    lnfb = lnfw + 1;
    auto expect = [&](std::size_t i, const std::string& name) {
      DS_CHECK(infos[i].name == name, "GptCuda: parameter " << i << " is '" << infos[i].name
                                                            << "', expected '" << name << "'");
    };
    expect(wte, "wte.weight");
    expect(wpe, "wpe.weight");
    for (std::size_t l = 0; l < L; ++l) {
      const std::string p = "h." + std::to_string(l) + ".";
      const LayerIdx& P = layers[l];
      expect(P.ln1w, p + "ln_1.weight"); expect(P.ln1b, p + "ln_1.bias");
      expect(P.qkvw, p + "attn.c_attn.weight"); expect(P.qkvb, p + "attn.c_attn.bias");
      expect(P.projw, p + "attn.c_proj.weight"); expect(P.projb, p + "attn.c_proj.bias");
      expect(P.ln2w, p + "ln_2.weight"); expect(P.ln2b, p + "ln_2.bias");
      expect(P.fcw, p + "mlp.c_fc.weight"); expect(P.fcb, p + "mlp.c_fc.bias");
      expect(P.fcprojw, p + "mlp.c_proj.weight"); expect(P.fcprojb, p + "mlp.c_proj.bias");
    }
    expect(lnfw, "ln_f.weight");
    expect(lnfb, "ln_f.bias");

    open_device();
  }

  ~Impl() {
    // No throwing here: errors are ignored (a failed run has reported them already).
    // DecoderCuda's destructor frees the rest.
    if (stream) (void)cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
  }

  // ---- activations ----
  void ensure(std::int64_t Bn, std::int64_t Tn) override {
    flash = use_flash();
    if (arena_fits(Bn, Tn) && arena_flash == flash) return;
    grow_arena(Bn, Tn, [this](char* base) { return layout(base); });
    arena_flash = flash;
  }

  // Carves the arena (base null: only counts). Returns the bytes needed.
  std::size_t layout(char* base) {
    const std::int64_t N = cap_bt, C = cfg.n_embd, L = cfg.n_layer, V = cfg.vocab_size, NH = cfg.n_head;
    // Attention probabilities: B*NH*T*T = (BT)*NH*T <= cap_bt*NH*cap_t (none with flash).
    const std::int64_t att = flash ? 0 : N * NH * cap_t;
    Carve c = carve(base);
    auto te = [&](std::int64_t n) { return c.elems(n); };
    auto tf = [&](std::int64_t n) { return c.floats(n); };
    acts.assign(std::size_t(L), LayerAct{});
    for (auto& a : acts) {
      a.ln1 = te(N * C); a.qkv = te(3 * N * C); a.att = te(att); a.atty = te(N * C); a.x1 = te(N * C);
      a.ln2 = te(N * C); a.fch = te(4 * N * C); a.fch_gelu = te(4 * N * C);
      a.ln1_mean = tf(N); a.ln1_rstd = tf(N); a.ln2_mean = tf(N); a.ln2_rstd = tf(N);
      a.att_lse = flash ? tf(N * NH) : nullptr;
      if (flash) a.att = nullptr;
    }
    resid.assign(std::size_t(L + 1), nullptr);
    for (auto& r : resid) r = te(N * C);
    lnf = te(N * C); logits = te(N * V);
    q = te(N * C); k = te(N * C); v = te(N * C); yh = te(N * C);
    dres = te(N * C); dln = te(N * C); dfch = te(4 * N * C); dqkv = te(3 * N * C); datty = te(N * C);
    dyh = te(N * C); dq = te(N * C); dk = te(N * C); dv = te(N * C); datt = te(att);
    lnf_mean = tf(N); lnf_rstd = tf(N); lse = tf(N);
    // fp32 scratch, used by one kernel at a time (all on one stream): the embedding's
    // V*C accumulator, LayerNorm / bias reductions, the fp32 row of logits_last.
    std::size_t sf = std::size_t(V * C);
    sf = std::max(sf, kc::layernorm_scratch_floats(N, C));
    for (std::int64_t oc : {C, 3 * C, 4 * C}) sf = std::max(sf, kc::bias_scratch_floats(N, oc));
    if (flash) sf = std::max(sf, kc::flash_backward_scratch_floats(N / std::max<std::int64_t>(cap_t, 1) * NH, cap_t, C / NH));
    return carve_tail(c, sf);
  }

  // Gpt::run_layers over every layer on the device; tokens already in d_tokens.
  void run_forward(std::int64_t Bn, std::int64_t Tn) override {
    const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, N = Bn * Tn;
    B = Bn;
    T = Tn;
    {
      GroupUse use(hooks, 0, Pass::Forward);
      Scope op(this, "embedding fwd");
      kc::embedding_forward(resid[0], d_tokens, w[wte], w[wpe], Bn, Tn, C, dt, stream);
    }
    for (std::size_t l = 0; l < layers.size(); ++l) {
      GroupUse use(hooks, l + 1, Pass::Forward);
      block_forward(l, Bn, Tn);
    }
    {
      GroupUse use(hooks, layers.size() + 1, Pass::Forward);
      Scope op(this, "layernorm fwd");
      kc::layernorm_forward(lnf, lnf_mean, lnf_rstd, resid.back(), w[lnfw], w[lnfb], N, C, dt, stream);
    }
    {
      GroupUse use(hooks, 0, Pass::Forward);
      Scope op(this, "lm head fwd (GEMM)");
      linear_fwd(logits, lnf, w[wte], N, C, V);  // tied LM head
    }
  }

  // Block l: resid[l + 1] from resid[l], its activations into acts[l].
  void block_forward(std::size_t l, std::int64_t Bn, std::int64_t Tn) {
    const std::int64_t C = cfg.n_embd, N = Bn * Tn;
    const LayerIdx& P = layers[l];
    const LayerAct& a = acts[l];
    const void* x = resid[l];
    {
      Scope op(this, "layernorm fwd");
      kc::layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w[P.ln1w], w[P.ln1b], N, C, dt, stream);
    }
    {
      Scope op(this, "qkv linear fwd (GEMM)");
      linear_fwd(a.qkv, a.ln1, w[P.qkvw], N, C, 3 * C);
    }
    {
      Scope op(this, "bias/residual add");
      kc::add_bias_residual(a.qkv, w[P.qkvb], nullptr, N, 3 * C, dt, stream);
    }
    attention_forward(a, Bn, Tn);
    {
      // x1 = x + c_proj(atty)
      Scope op(this, "attn proj linear fwd (GEMM)");
      linear_fwd(a.x1, a.atty, w[P.projw], N, C, C);
    }
    {
      Scope op(this, "bias/residual add");
      kc::add_bias_residual(a.x1, w[P.projb], x, N, C, dt, stream);
    }
    // x2 = x1 + c_proj(gelu(c_fc(ln_2(x1))))
    {
      Scope op(this, "layernorm fwd");
      kc::layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.x1, w[P.ln2w], w[P.ln2b], N, C, dt, stream);
    }
    {
      Scope op(this, "fc linear fwd (GEMM)");
      linear_fwd(a.fch, a.ln2, w[P.fcw], N, C, 4 * C);
    }
    {
      Scope op(this, "bias/residual add");
      kc::add_bias_residual(a.fch, w[P.fcb], nullptr, N, 4 * C, dt, stream);
    }
    {
      Scope op(this, "gelu fwd");
      kc::gelu_forward(a.fch_gelu, a.fch, 4 * N * C, dt, stream);
    }
    {
      Scope op(this, "fc proj linear fwd (GEMM)");
      linear_fwd(resid[l + 1], a.fch_gelu, w[P.fcprojw], N, 4 * C, C);
    }
    {
      Scope op(this, "bias/residual add");
      kc::add_bias_residual(resid[l + 1], w[P.fcprojb], a.x1, N, C, dt, stream);
    }
  }

  // Attention: scores into att, softmax in place, yh = att v, heads merged into atty.
  void attention_forward(const LayerAct& a, std::int64_t Bn, std::int64_t Tn) {
    const std::int64_t C = cfg.n_embd, NH = cfg.n_head, hs = C / NH, BNH = Bn * NH;
    const float att_scale = 1.0f / std::sqrt(float(hs));
    Scope op(this, "attention fwd");
    kc::split_qkv(q, k, v, a.qkv, Bn, Tn, C, NH, dt, stream);
    if (flash) {
      kc::flash_attention_forward(yh, a.att_lse, q, k, v, BNH, Tn, hs, att_scale, dt, stream);
    } else {
      // Block-causal (see att_block): for the query rows [q0, q0 + nq) only keys < q0 + nq.
      const std::int64_t Bq = std::min(att_block, Tn);
      attention_scores(a.att, q, k, hs, Bq, BNH);
      kc::causal_softmax_forward_blocks(a.att, a.att, att_scale, BNH, Tn, Bq, dt, stream);
      attention_values(yh, a.att, v, hs, Bq, BNH);
    }
    kc::merge_heads(a.atty, yh, Bn, Tn, C, NH, dt, stream);
  }

  void loss_kernels(std::int64_t N) override {
    Scope op(this, "cross-entropy fwd");
    DecoderCuda::loss_kernels(N);
  }

  using GradReady = std::function<void(std::size_t)>;
  static void report_ready(const GradReady& grad_ready, std::size_t i) {
    if (grad_ready) grad_ready(i);
  }

  // Gpt::run_backward over every layer on the device, the same grad_ready order.
  void backward(float scale, const GradReady& grad_ready) override {
    take_cache();
    const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, N = B * T;
    {
      // Fused softmax + cross-entropy gradient, in place over the logits.
      Scope op(this, "cross-entropy bwd");
      kc::crossentropy_backward(logits, lse, d_targets, N, V, scale, dt, stream);
    }
    {
      // LM head (tied to wte): dlnf = dlogits wte ; dwte += dlogits^T lnf.
      GroupUse use(hooks, 0, Pass::Backward);
      Scope op(this, "lm head bwd (2 GEMMs)");
      linear_dinp(dln, logits, w[wte], N, C, V);
      linear_dw(g[wte], logits, lnf, N, C, V);
    }
    {
      GroupUse use(hooks, layers.size() + 1, Pass::Backward);
      {
        Scope op(this, "layernorm bwd");
        DS_CUDA_CHECK(cudaMemsetAsync(dres, 0, std::size_t(N * C) * dtype_size(dt), stream));
        kc::layernorm_backward(dres, g[lnfw], g[lnfb], dln, resid.back(), w[lnfw], lnf_mean, lnf_rstd, N, C, scratch,
                               dt, stream);
      }
      report_ready(grad_ready, lnfw);
      report_ready(grad_ready, lnfb);
    }
    for (std::size_t li = layers.size(); li-- > 0;) {
      GroupUse use(hooks, li + 1, Pass::Backward);
      mlp_backward(li, grad_ready);
      attention_block_backward(li, grad_ready);
    }
    GroupUse use(hooks, 0, Pass::Backward);
    {
      Scope op(this, "embedding bwd");
      kc::embedding_backward(g[wte], g[wpe], dres, d_tokens, B, T, C, V, scratch, dt, stream);
    }
    report_ready(grad_ready, wpe);
    report_ready(grad_ready, wte);
  }

  // A Linear's backward: dinp = dout w, dw += dout^T inp (2 GEMMs, under `op`), then its bias
  // gradient; grad_ready for the weight, then the bias. C: the input features, OC: the output's.
  void linear_backward(const char* op, void* dinp, const void* dout, const void* inp, std::size_t wid, std::size_t bid,
                       std::int64_t C, std::int64_t OC, const GradReady& grad_ready) {
    const std::int64_t N = B * T;
    {
      Scope scope(this, op);
      linear_dinp(dinp, dout, w[wid], N, C, OC);
      linear_dw(g[wid], dout, inp, N, C, OC);
    }
    report_ready(grad_ready, wid);
    {
      Scope scope(this, "bias grad");
      kc::bias_backward(g[bid], dout, N, OC, scratch, dt, stream);
    }
    report_ready(grad_ready, bid);
  }

  // MLP: x2 = x1 + c_proj(gelu(c_fc(ln_2(x1)))); dres holds dL/dx2, then dL/dx1.
  void mlp_backward(std::size_t li, const GradReady& grad_ready) {
    const std::int64_t C = cfg.n_embd, N = B * T;
    const LayerIdx& P = layers[li];
    const LayerAct& a = acts[li];
    linear_backward("fc proj linear bwd (2 GEMMs)", dfch, dres, a.fch_gelu, P.fcprojw, P.fcprojb, 4 * C, C, grad_ready);
    {
      Scope op(this, "gelu bwd");
      kc::gelu_backward(dfch, a.fch, dfch, 4 * N * C, dt, stream);
    }
    linear_backward("fc linear bwd (2 GEMMs)", dln, dfch, a.ln2, P.fcw, P.fcb, C, 4 * C, grad_ready);
    {
      Scope op(this, "layernorm bwd");
      kc::layernorm_backward(dres, g[P.ln2w], g[P.ln2b], dln, a.x1, w[P.ln2w], a.ln2_mean, a.ln2_rstd, N, C,
                             scratch, dt, stream);
    }
    report_ready(grad_ready, P.ln2w);
    report_ready(grad_ready, P.ln2b);
  }

  // Attention: x1 = x + c_proj(attn(c_attn(ln_1(x)))); dres holds dL/dx1, then dL/dx.
  void attention_block_backward(std::size_t li, const GradReady& grad_ready) {
    const std::int64_t C = cfg.n_embd, N = B * T;
    const LayerIdx& P = layers[li];
    const LayerAct& a = acts[li];
    linear_backward("attn proj linear bwd (2 GEMMs)", datty, dres, a.atty, P.projw, P.projb, C, C, grad_ready);
    attention_backward(a);
    linear_backward("qkv linear bwd (2 GEMMs)", dln, dqkv, a.ln1, P.qkvw, P.qkvb, C, 3 * C, grad_ready);
    {
      Scope op(this, "layernorm bwd");
      kc::layernorm_backward(dres, g[P.ln1w], g[P.ln1b], dln, resid[li], w[P.ln1w], a.ln1_mean, a.ln1_rstd, N, C,
                             scratch, dt, stream);
    }
    report_ready(grad_ready, P.ln1w);
    report_ready(grad_ready, P.ln1b);
  }

  // The attention core: datty into dqkv.
  void attention_backward(const LayerAct& a) {
    const std::int64_t C = cfg.n_embd, NH = cfg.n_head, hs = C / NH, BNH = B * NH;
    const float att_scale = 1.0f / std::sqrt(float(hs));
    {
      Scope op(this, "attention bwd");
      // q, k, v again from the saved qkv (cheaper than keeping them per layer).
      kc::split_qkv(q, k, v, a.qkv, B, T, C, NH, dt, stream);
      kc::split_heads(dyh, datty, B, T, C, NH, dt, stream);
      if (flash) {
        kc::split_heads(yh, a.atty, B, T, C, NH, dt, stream);  // the forward's output o
        kc::flash_attention_backward(dq, dk, dv, q, k, v, yh, dyh, a.att_lse, scratch, BNH, T, hs, att_scale, dt,
                                     stream);
        kc::merge_qkv(dqkv, dq, dk, dv, B, T, C, NH, dt, stream);
      }
    }
    if (!flash) {
      Scope op(this, "attention bwd");
      // Block-causal as the forward: query block [q0, q0 + nq) sees keys < q0 + nq; key block
      // [k0, k0 + nk) is seen by queries >= k0 (above the diagonal inside the diagonal block
      // the softmax wrote zeros, so those products add nothing).
      const std::int64_t Bq = std::min(att_block, T);
      attention_values_backward(datt, dv, dyh, a.att, v, hs, Bq, BNH);
      kc::causal_softmax_backward_blocks(datt, a.att, datt, att_scale, BNH, T, Bq, dt, stream);  // datt -> dS
      attention_scores_backward(dq, dk, datt, q, k, hs, Bq, BNH);
      kc::merge_qkv(dqkv, dq, dk, dv, B, T, C, NH, dt, stream);
    }
  }
};

GptCuda::GptCuda(const GptConfig& cfg, bool allow_tf32, const GptCudaAttention& attention)
    : CudaDecoder(std::make_unique<Impl>(cfg, allow_tf32, attention)) {
  impl().init();  // on failure impl_'s destructor releases what init() created
}

GptCuda::Impl& GptCuda::impl() { return static_cast<Impl&>(*impl_); }

void GptCuda::set_profiling(bool on) {
  impl().take_profile();  // drops nothing: folds what is pending into the totals
  impl().profiling = on;
  impl().prof.reset();
}

std::vector<GptCuda::OpTime> GptCuda::profile() {
  impl().take_profile();
  return impl().prof.rows();
}

const GptConfig& GptCuda::config() const { return static_cast<const Impl&>(*impl_).cfg; }

}  // namespace ds::nn
