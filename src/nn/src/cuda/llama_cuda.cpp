// LlamaCuda: ds::nn::Llama on a CUDA device (see ds/nn/llama_cuda.h). The forward/backward
// sequence, the grad_ready order, the group brackets and the sampler are those of
// src/nn/src/llama.cpp (Llama::layer_forward / run_forward / backward); keep them in step.
// The row-major-through-column-major cuBLAS calls and the block-causal attention GEMMs are
// GptCuda's (src/nn/src/cuda/gpt_cuda.cpp derives them), over the per-head tensors qh, kh, vh.
#include "ds/nn/llama_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <string>

#include "../sampling.h"
#include "attention_blocks.h"
#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "ds/nn/cuda_kernels.h"
#include "ds/nn/cuda_llama_kernels.h"
#include "ds/nn/llama.h"
#include "ds/nn/llama_kernels.h"

#define DS_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                        \
    cublasStatus_t ds_cublas_st_ = (call);                                                    \
    if (ds_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      DS_THROW("cuBLAS call " #call " failed: " << cublasGetStatusName(ds_cublas_st_) << " (" \
                                                << cublasGetStatusString(ds_cublas_st_) << ")"); \
  } while (0)

namespace ds::nn {

namespace kc = ds::nn::cuda;

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;  // cuBLAS workspace
constexpr std::size_t kAlign = 256;                             // every arena array

int to_int(std::int64_t v, const char* what) {
  DS_CHECK(v >= 0 && v <= std::int64_t(INT_MAX),
           "LlamaCuda: " << what << " = " << v << " does not fit a cuBLAS int argument");
  return int(v);
}

}  // namespace

struct LlamaCuda::Impl {
  struct LayerIdx { std::size_t q = 0, k = 0, v = 0, o = 0, gate = 0, up = 0, down = 0, ln1 = 0, ln2 = 0; };
  // Saved activations of one decoder layer (dt elements; rstd fp32). q and k after the rotation.
  struct LayerAct {
    void *ln1, *q, *k, *v, *att, *atty, *x1, *ln2, *gate, *up, *h;
    float *rstd1, *rstd2;
  };

  Llama twin;  // parameters(), init_parameters(), groups, flops: never bound, never run
  LlamaConfig cfg;
  bool allow_tf32;
  std::int64_t att_block;
  std::int64_t hd = 0, KV = 0;
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  float *d_cos = nullptr, *d_sin = nullptr;  // rotary tables [block_size, hd / 2]

  std::size_t embed = 0, normf = 0, head = 0;  // head == embed when tied
  std::vector<LayerIdx> layers;
  std::vector<ParamGroup> groups;
  std::size_t final_group() const { return groups.size() - 1; }
  std::size_t head_group() const { return cfg.tie_embeddings ? 0 : final_group(); }

  bool bound = false;
  DType dt = DType::F32;
  std::vector<void*> w, g;
  GroupHooks* hooks = nullptr;

  void* at(void* p, std::int64_t n) const { return static_cast<char*>(p) + n * std::int64_t(dtype_size(dt)); }
  const void* at(const void* p, std::int64_t n) const {
    return static_cast<const char*>(p) + n * std::int64_t(dtype_size(dt));
  }

  char* arena = nullptr;
  DType arena_dt = DType::F32;
  std::int64_t cap_bt = 0, cap_t = 0;
  std::vector<LayerAct> acts;
  std::vector<void*> resid;  // n_layer + 1 residual streams [N, C]
  void *lnf = nullptr, *logits = nullptr;
  void *qh = nullptr, *kh = nullptr, *vh = nullptr, *yh = nullptr;  // [B,NH,T,hd], shared by layers
  void *dres = nullptr, *dln = nullptr, *datty = nullptr, *dyh = nullptr, *dqh = nullptr, *dkh = nullptr,
       *dvh = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *dgate = nullptr, *dup = nullptr,
       *dh = nullptr, *datt = nullptr;
  float *rstdf = nullptr, *lse = nullptr, *losses = nullptr, *d_loss = nullptr, *scratch = nullptr;
  std::int32_t *d_tokens = nullptr, *d_targets = nullptr;

  void* pinned = nullptr;
  std::int64_t pinned_cap = 0;
  std::int32_t *h_tokens = nullptr, *h_targets = nullptr;
  float* h_loss = nullptr;

  std::int64_t B = 0, T = 0;
  bool have_cache = false;

  Impl(const LlamaConfig& c, bool tf32, std::int64_t block)
      : twin(c), cfg(twin.config()), allow_tf32(tf32), att_block(block) {
    DS_CHECK(block >= 1, "LlamaCuda: attention block " << block << " rows: expected at least 1");
  }

  void init() {
    hd = cfg.n_embd / cfg.n_head;
    KV = cfg.n_kv_head * hd;
    layers.assign(std::size_t(cfg.n_layer), LayerIdx{});
    const auto layout = llama_parameters(cfg);
    const auto infos = twin.parameters();
    DS_CHECK(layout.size() == infos.size(), "LlamaCuda: layout has " << layout.size() << " parameters, Llama "
                                                                     << infos.size());
    for (std::size_t id = 0; id < layout.size(); ++id) {
      const LlamaParam& p = layout[id];
      DS_CHECK(infos[id].name == p.name, "LlamaCuda: parameter " << id << " is '" << infos[id].name
                                                                 << "', the layout says '" << p.name << "'");
      LayerIdx* L = p.layer >= 0 ? &layers[std::size_t(p.layer)] : nullptr;
      switch (p.role) {
        case LlamaRole::Embedding: embed = id; break;
        case LlamaRole::FinalNorm: normf = id; break;
        case LlamaRole::LmHead: head = id; break;
        case LlamaRole::QProj: L->q = id; break;
        case LlamaRole::KProj: L->k = id; break;
        case LlamaRole::VProj: L->v = id; break;
        case LlamaRole::OProj: L->o = id; break;
        case LlamaRole::GateProj: L->gate = id; break;
        case LlamaRole::UpProj: L->up = id; break;
        case LlamaRole::DownProj: L->down = id; break;
        case LlamaRole::InputNorm: L->ln1 = id; break;
        case LlamaRole::PostAttnNorm: L->ln2 = id; break;
      }
    }
    if (cfg.tie_embeddings) head = embed;
    groups = twin.parameter_groups();

    DS_CUDA_CHECK(cudaGetDevice(&device));
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DS_CUBLAS_CHECK(cublasCreate(&blas));
    DS_CUBLAS_CHECK(cublasSetStream(blas, stream));
    DS_CUBLAS_CHECK(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
    // Split-K reductions in fp32, as GptCuda: weight gradients accumulate with one rounding.
    DS_CUBLAS_CHECK(cublasSetMathMode(
        blas, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    DS_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
    DS_CUBLAS_CHECK(cublasSetWorkspace(blas, workspace, kWorkspaceBytes));
    // The CPU model's rotary tables (the same fp32 values), uploaded once.
    const std::size_t nt = std::size_t(cfg.block_size * hd / 2);
    std::vector<float> c(nt), s(nt);
    kernels::rope_tables(c.data(), s.data(), cfg.block_size, hd, cfg.rope_theta);
    DS_CUDA_CHECK(cudaMalloc(&d_cos, nt * sizeof(float)));
    DS_CUDA_CHECK(cudaMalloc(&d_sin, nt * sizeof(float)));
    DS_CUDA_CHECK(cudaMemcpy(d_cos, c.data(), nt * sizeof(float), cudaMemcpyHostToDevice));
    DS_CUDA_CHECK(cudaMemcpy(d_sin, s.data(), nt * sizeof(float), cudaMemcpyHostToDevice));
  }

  ~Impl() {
    if (stream) (void)cudaStreamSynchronize(stream);
    if (arena) (void)cudaFree(arena);
    if (pinned) (void)cudaFreeHost(pinned);
    if (d_cos) (void)cudaFree(d_cos);
    if (d_sin) (void)cudaFree(d_sin);
    if (blas) (void)cublasDestroy(blas);
    if (workspace) (void)cudaFree(workspace);
    if (stream) (void)cudaStreamDestroy(stream);
  }

  // ---- cuBLAS (gpt_cuda.cpp's header comment derives the operands) ----
  cudaDataType_t ctype() const {
    switch (dt) {
      case DType::F16: return CUDA_R_16F;
      case DType::BF16: return CUDA_R_16BF;
      default: return CUDA_R_32F;
    }
  }
  cublasComputeType_t compute() const {
    return dt == DType::F32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  }
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t kk,
            const void* A, std::int64_t lda, const void* Bm, std::int64_t ldb, void* Cm, std::int64_t ldc,
            float beta) {
    const float alpha = 1.0f;
    DS_CUBLAS_CHECK(cublasGemmEx(blas, ta, tb, to_int(m, "m"), to_int(n, "n"), to_int(kk, "k"), &alpha, A,
                                 ctype(), to_int(lda, "lda"), Bm, ctype(), to_int(ldb, "ldb"), &beta, Cm,
                                 ctype(), to_int(ldc, "ldc"), compute(), CUBLAS_GEMM_DEFAULT));
  }
  void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t kk,
                    const void* A, std::int64_t lda, std::int64_t sa, const void* Bm, std::int64_t ldb,
                    std::int64_t sb, void* Cm, std::int64_t ldc, std::int64_t sc, std::int64_t batch) {
    const float alpha = 1.0f, beta = 0.0f;
    DS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        blas, ta, tb, to_int(m, "m"), to_int(n, "n"), to_int(kk, "k"), &alpha, A, ctype(), to_int(lda, "lda"),
        (long long)sa, Bm, ctype(), to_int(ldb, "ldb"), (long long)sb, &beta, Cm, ctype(), to_int(ldc, "ldc"),
        (long long)sc, to_int(batch, "batch"), compute(), CUBLAS_GEMM_DEFAULT));
  }
  // out[N,OC] = inp[N,C] w[OC,C]^T
  void linear_fwd(void* out, const void* inp, const void* wt, std::int64_t N, std::int64_t C, std::int64_t OC) {
    gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, wt, C, inp, C, out, OC, 0.0f);
  }
  // dinp[N,C] (beta 0: =, 1: +=) dout[N,OC] w[OC,C]
  void linear_dinp(void* dinp, const void* dout, const void* wt, std::int64_t N, std::int64_t C, std::int64_t OC,
                   float beta) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, wt, C, dout, OC, dinp, C, beta);
  }
  // dw[OC,C] += dout[N,OC]^T inp[N,C]
  void linear_dw(void* dw, const void* dout, const void* inp, std::int64_t N, std::int64_t C, std::int64_t OC) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, dw, C, 1.0f);
  }

  // ---- activations ----
  void ensure(std::int64_t Bn, std::int64_t Tn) {
    const std::int64_t BT = Bn * Tn;
    if (arena && BT <= cap_bt && Tn <= cap_t && arena_dt == dt) return;
    cap_bt = std::max(cap_bt, BT);
    cap_t = std::max(cap_t, Tn);
    if (arena) {
      DS_CUDA_CHECK(cudaStreamSynchronize(stream));  // earlier work may still read it
      char* old = arena;
      arena = nullptr;
      DS_CUDA_CHECK(cudaFree(old));
    }
    const std::size_t bytes = layout(nullptr);
    void* p = nullptr;
    DS_CUDA_CHECK(cudaMalloc(&p, bytes));
    arena = static_cast<char*>(p);
    arena_dt = dt;
    layout(arena);
    if (pinned_cap < cap_bt) {
      if (pinned) {
        void* old = pinned;
        pinned = nullptr;
        pinned_cap = 0;
        DS_CUDA_CHECK(cudaFreeHost(old));  // every copy from it has completed (forward syncs)
      }
      DS_CUDA_CHECK(cudaMallocHost(&pinned, std::size_t(cap_bt) * 2 * sizeof(std::int32_t) + 64));
      pinned_cap = cap_bt;
      h_loss = static_cast<float*>(pinned);
      h_tokens = reinterpret_cast<std::int32_t*>(static_cast<char*>(pinned) + 64);
      h_targets = h_tokens + cap_bt;
    }
  }

  // Carves the arena (base null: only counts). Returns the bytes needed.
  std::size_t layout(char* base) {
    const std::int64_t N = cap_bt, C = cfg.n_embd, L = cfg.n_layer, V = cfg.vocab_size, NH = cfg.n_head;
    const std::int64_t I = cfg.intermediate_size;
    const std::int64_t att = N * NH * cap_t;  // B*NH*T*T <= cap_bt*NH*cap_t
    const std::size_t es = dtype_size(dt);
    std::size_t off = 0;
    auto take = [&](std::size_t b) -> char* {
      char* r = base ? base + off : nullptr;
      off += (b + kAlign - 1) / kAlign * kAlign;
      return r;
    };
    auto te = [&](std::int64_t n) -> void* { return take(std::size_t(n) * es); };
    auto tf = [&](std::int64_t n) -> float* { return reinterpret_cast<float*>(take(std::size_t(n) * 4)); };
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
    rstdf = tf(N); lse = tf(N); losses = tf(N); d_loss = tf(1);
    // fp32 scratch, one kernel at a time (one stream): the embedding's V*C accumulator, the
    // RMSNorm weight-gradient partials, the fp32 row of logits_last.
    std::size_t sf = std::size_t(V * C);
    sf = std::max(sf, kc::rmsnorm_scratch_floats(N, C));
    sf = std::max(sf, std::size_t(V));
    scratch = tf(std::int64_t(sf));
    d_tokens = reinterpret_cast<std::int32_t*>(take(std::size_t(N) * 4));
    d_targets = reinterpret_cast<std::int32_t*>(take(std::size_t(N) * 4));
    return off;
  }

  void upload(const std::int32_t* tok, const std::int32_t* tgt, std::int64_t N) {
    std::memcpy(h_tokens, tok, std::size_t(N) * 4);
    DS_CUDA_CHECK(cudaMemcpyAsync(d_tokens, h_tokens, std::size_t(N) * 4, cudaMemcpyHostToDevice, stream));
    if (tgt) {
      std::memcpy(h_targets, tgt, std::size_t(N) * 4);
      DS_CUDA_CHECK(cudaMemcpyAsync(d_targets, h_targets, std::size_t(N) * 4, cudaMemcpyHostToDevice, stream));
    }
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
    const std::int64_t BNH = B * NH, TT = T * T;
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
    for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // S[q0.., 0..kend) = q k^T
      const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
      gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, kend, nq, hd, kh, hd, T * hd, at(qh, q0 * hd), hd, T * hd,
                   at(a.att, q0 * T), T, TT, BNH);
    }
    kc::causal_softmax_forward_blocks(a.att, a.att, att_scale, BNH, T, Bq, dt, stream);
    for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // yh[q0..] = att[q0.., 0..kend) v
      const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
      gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hd, nq, kend, vh, hd, T * hd, at(a.att, q0 * T), T, TT,
                   at(yh, q0 * hd), hd, T * hd, BNH);
    }
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

  // Llama::run_forward on the device; tokens already in d_tokens.
  void run_forward(std::int64_t Bn, std::int64_t Tn) {
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

  void check_bound(const char* who) const { DS_CHECK(bound, "LlamaCuda::" << who << ": bind() the parameters first"); }

  float loss_forward(const Batch& batch, const char* who) {
    check_bound(who);
    const std::int64_t Bn = batch.batch, Tn = batch.seq, V = cfg.vocab_size;
    DS_CHECK(Bn > 0 && Tn > 0, "LlamaCuda::" << who << ": batch (" << Bn << ") and seq (" << Tn << ") must be > 0");
    DS_CHECK(Tn <= cfg.block_size,
             "LlamaCuda::" << who << ": seq " << Tn << " exceeds block_size " << cfg.block_size);
    const std::size_t N = std::size_t(Bn * Tn);
    DS_CHECK(batch.inputs.size() == N && batch.targets.size() == N,
             "LlamaCuda::" << who << ": inputs/targets must hold batch*seq = " << N << " tokens, got "
                           << batch.inputs.size() << "/" << batch.targets.size());
    for (std::size_t i = 0; i < N; ++i) {
      const std::int32_t a = batch.inputs[i], b = batch.targets[i];
      DS_CHECK(a >= 0 && a < V && b >= 0 && b < V,
               "LlamaCuda::" << who << ": token id out of range [0, " << V << ") at position " << i << " (input "
                             << a << ", target " << b << ")");
    }
    ensure(Bn, Tn);
    upload(batch.inputs.data(), batch.targets.data(), std::int64_t(N));
    run_forward(Bn, Tn);
    kc::crossentropy_forward(losses, lse, logits, d_targets, std::int64_t(N), V, dt, stream);
    kc::mean(d_loss, losses, std::int64_t(N), stream);
    DS_CUDA_CHECK(cudaMemcpyAsync(h_loss, d_loss, sizeof(float), cudaMemcpyDeviceToHost, stream));
    DS_CUDA_CHECK(cudaStreamSynchronize(stream));
    return *h_loss;
  }

  // Llama::backward on the device: the same grad_ready order and brackets.
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
    DS_CHECK(have_cache, "LlamaCuda::backward: call forward() first (evaluate() and generation do not "
                         "keep activations for backward)");
    have_cache = false;
    auto ready = [&](std::size_t i) {
      if (grad_ready) grad_ready(i);
    };
    const std::int64_t C = cfg.n_embd, V = cfg.vocab_size, N = B * T, I = cfg.intermediate_size;
    const std::int64_t NH = cfg.n_head, NKV = cfg.n_kv_head, BNH = B * NH, TT = T * T;
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
      for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // datt[q0.., 0..kend) = dyh v^T
        const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
        gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, kend, nq, hd, vh, hd, T * hd, at(dyh, q0 * hd), hd, T * hd,
                     at(datt, q0 * T), T, TT, BNH);
      }
      for (std::int64_t k0 = 0; k0 < T; k0 += Bq) {  // dv[k0..] = att[k0.., k0..k0+nk)^T dyh[k0..]
        const std::int64_t nk = std::min(Bq, T - k0);
        gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hd, nk, T - k0, at(dyh, k0 * hd), hd, T * hd, at(a.att, k0 * T + k0),
                     T, TT, at(dvh, k0 * hd), hd, T * hd, BNH);
      }
      kc::causal_softmax_backward_blocks(datt, a.att, datt, att_scale, BNH, T, Bq, dt, stream);  // datt -> dS
      for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // dq[q0..] = dS[q0.., 0..kend) k
        const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
        gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hd, nq, kend, kh, hd, T * hd, at(datt, q0 * T), T, TT,
                     at(dqh, q0 * hd), hd, T * hd, BNH);
      }
      for (std::int64_t k0 = 0; k0 < T; k0 += Bq) {  // dk[k0..] = dS[k0.., k0..k0+nk)^T q[k0..]
        const std::int64_t nk = std::min(Bq, T - k0);
        gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hd, nk, T - k0, at(qh, k0 * hd), hd, T * hd, at(datt, k0 * T + k0),
                     T, TT, at(dkh, k0 * hd), hd, T * hd, BNH);
      }
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

  std::vector<float> logits_last(std::span<const std::int32_t> context) {
    DS_CHECK(!context.empty(), "LlamaCuda::logits_last: empty context");
    check_bound("logits_last");
    have_cache = false;
    const std::int64_t V = cfg.vocab_size;
    const std::size_t Tn = std::min<std::size_t>(context.size(), std::size_t(cfg.block_size));
    const std::int32_t* tok = context.data() + (context.size() - Tn);
    for (std::size_t i = 0; i < Tn; ++i)
      DS_CHECK(tok[i] >= 0 && tok[i] < V, "LlamaCuda::logits_last: token " << tok[i] << " outside [0, " << V << ")");
    ensure(1, std::int64_t(Tn));
    upload(tok, nullptr, std::int64_t(Tn));
    run_forward(1, std::int64_t(Tn));
    const char* row =
        static_cast<const char*>(logits) + std::size_t(std::int64_t(Tn) - 1) * std::size_t(V) * dtype_size(dt);
    const void* src = row;
    if (dt != DType::F32) {
      kc::convert(scratch, DType::F32, row, dt, V, stream);
      src = scratch;
    }
    std::vector<float> out(static_cast<std::size_t>(V));
    DS_CUDA_CHECK(cudaMemcpyAsync(out.data(), src, std::size_t(V) * sizeof(float), cudaMemcpyDeviceToHost, stream));
    DS_CUDA_CHECK(cudaStreamSynchronize(stream));
    return out;
  }
};

LlamaCuda::LlamaCuda(const LlamaConfig& cfg, bool allow_tf32, std::int64_t attention_block)
    : impl_(std::make_unique<Impl>(cfg, allow_tf32, attention_block)) {
  impl_->init();  // on failure impl_'s destructor releases what init() created
}

LlamaCuda::~LlamaCuda() = default;

std::vector<ParamInfo> LlamaCuda::parameters() const { return impl_->twin.parameters(); }

std::vector<ParamGroup> LlamaCuda::parameter_groups() const { return impl_->groups; }

void LlamaCuda::set_group_hooks(GroupHooks* hooks) { impl_->hooks = hooks; }

void LlamaCuda::init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) {
  impl_->twin.init_parameters(params, seed);
}

void LlamaCuda::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  Impl& m = *impl_;
  const auto infos = m.twin.parameters();
  DS_CHECK(params.size() == infos.size() && grads.size() == infos.size(),
           "LlamaCuda::bind: expected " << infos.size() << " parameter and gradient views, got " << params.size()
                                        << " and " << grads.size());
  const DType dt = params[0].dtype;
  DS_CHECK(dt == DType::F32 || dt == DType::F16 || dt == DType::BF16,
           "LlamaCuda::bind: working dtype must be fp32, fp16 or bf16, got " << dtype_name(dt));
  auto check_view = [&](const TensorView& t, const ParamInfo& info, const char* kind) {
    DS_CHECK(t.dtype == dt, "LlamaCuda::bind: all parameters and gradients must share one dtype: "
                                << kind << " of '" << info.name << "' is " << dtype_name(t.dtype) << ", '"
                                << infos[0].name << "' is " << dtype_name(dt));
    DS_CHECK(t.count == info.numel(), "LlamaCuda::bind: " << kind << " of '" << info.name << "' has " << t.count
                                                          << " elements, expected " << info.numel());
    DS_CHECK(t.data != nullptr, "LlamaCuda::bind: " << kind << " of '" << info.name << "' is null");
    cudaPointerAttributes attr{};
    DS_CUDA_CHECK(cudaPointerGetAttributes(&attr, t.data));
    DS_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
             "LlamaCuda::bind: " << kind << " of '" << info.name << "' is not device memory");
    DS_CHECK(attr.device == m.device, "LlamaCuda::bind: " << kind << " of '" << info.name << "' lives on device "
                                                          << attr.device << ", the model on device " << m.device);
  };
  for (std::size_t i = 0; i < infos.size(); ++i) {
    check_view(params[i], infos[i], "parameter");
    check_view(grads[i], infos[i], "gradient");
  }
  m.w.resize(infos.size());
  m.g.resize(infos.size());
  for (std::size_t i = 0; i < infos.size(); ++i) {
    m.w[i] = params[i].data;
    m.g[i] = grads[i].data;
  }
  m.dt = dt;
  m.bound = true;
  m.have_cache = false;
}

float LlamaCuda::forward(const Batch& batch) {
  impl_->have_cache = false;
  const float loss = impl_->loss_forward(batch, "forward");
  impl_->have_cache = true;
  return loss;
}

void LlamaCuda::backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
  impl_->backward(scale, grad_ready);
}

float LlamaCuda::evaluate(const Batch& batch) {
  impl_->have_cache = false;
  return impl_->loss_forward(batch, "evaluate");
}

void* LlamaCuda::device_stream() const { return static_cast<void*>(impl_->stream); }

const LlamaConfig& LlamaCuda::config() const { return impl_->cfg; }

std::size_t LlamaCuda::num_parameters() const { return impl_->twin.num_parameters(); }

double LlamaCuda::flops_per_token(std::int64_t seq) const { return impl_->twin.flops_per_token(seq); }

std::vector<float> LlamaCuda::logits_last(std::span<const std::int32_t> context) {
  return impl_->logits_last(context);
}

// The sampler of Llama::generate (src/nn/src/sampling.h): the same logits give the same tokens.
std::vector<std::int32_t> LlamaCuda::generate(std::span<const std::int32_t> context, int n_new, float temperature,
                                              std::uint64_t seed) {
  return sample_tokens(context, n_new, temperature, seed,
                       [this](std::span<const std::int32_t> ctx) { return logits_last(ctx); });
}

}  // namespace ds::nn
