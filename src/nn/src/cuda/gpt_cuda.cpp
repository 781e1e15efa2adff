// GptCuda: ds::nn::Gpt on a CUDA device (see ds/nn/gpt_cuda.h). cuBLAS for every GEMM, the
// kernels of ds/nn/cuda_kernels.h for the rest; everything on one non-blocking stream.
//
// The forward/backward sequence, the grad_ready order and the sampler are those of
// src/nn/src/gpt.cpp (Gpt::run_forward / Gpt::backward / Gpt::generate); keep them in step.
//
// ---------------------------------------------------------------------------------------
// Row-major tensors through column-major cuBLAS. A row-major X[R,S] (row stride S) is, read
// column-major with ld = S, the matrix X^T [S x R]. cuBLAS computes C = op(A) op(B) with
// C [m x n], op(A) [m x k], op(B) [k x n], all column-major. So to get a row-major result
// Y[R,S] we let cuBLAS compute Y^T [S x R] (m = S, n = R, ldc = S), and pick op(A), op(B)
// so that op(A) op(B) = Y^T, remembering that each operand's memory reads as its transpose.
//
// Linear layer, inp[N,C], w[OC,C] (PyTorch layout), out[N,OC]:
//   fwd   out = inp w^T      out^T[OC x N] = w[OC x C] . inp^T[C x N]
//         w's memory reads as w^T [C x OC]     -> OP_T, lda = C
//         inp's memory reads as inp^T [C x N]  -> OP_N, ldb = C
//         gemm(T, N, m=OC, n=N, k=C, A=w,C, B=inp,C, C=out,OC)
//   dinp  dinp = dout w      dinp^T[C x N] = w^T[C x OC] . dout^T[OC x N]
//         w reads as w^T (OP_N, lda C), dout reads as dout^T [OC x N] (OP_N, ldb OC)
//         gemm(N, N, m=C, n=N, k=OC, A=w,C, B=dout,OC, C=dinp,C)                beta 0
//   dw    dw += dout^T inp   dw^T[C x OC] = inp^T[C x N] . dout[N x OC]
//         inp reads as inp^T (OP_N, lda C), dout reads as dout^T -> OP_T gives dout (ldb OC)
//         gemm(N, T, m=C, n=OC, k=N, A=inp,C, B=dout,OC, C=dw,C)                beta 1
//
// Attention, per (b, h) of the BNH batch, q/k/v/yh [T,hs], att/S [T,T] (row-major):
//   S  = q k^T    S^T[j,i] = sum_d k[j,d] q[i,d]:  A = k (reads k^T [hs x T], OP_T -> k),
//                 B = q (reads q^T, OP_N):  gemm(T, N, m=T, n=T, k=hs, k,hs, q,hs, S,T)
//   yh = att v    yh^T[d,i] = sum_j v[j,d] att[i,j] = (v^T . att^T)[d,i]:
//                 gemm(N, N, m=hs, n=T, k=T, v,hs, att,T, yh,hs)
//   datt = dyh v^T   (as S with q -> dyh, k -> v):  gemm(T, N, T, T, hs, v,hs, dyh,hs, datt,T)
//   dv = att^T dyh   dv^T[d,j] = sum_i dyh[i,d] att[i,j] = (dyh^T . att)[d,j]; att's memory
//                 reads as att^T, OP_T gives att:  gemm(N, T, m=hs, n=T, k=T, dyh,hs, att,T, dv,hs)
//   dq = dS k     dq^T[d,i] = sum_j k[j,d] dS[i,j] = (k^T . dS^T)[d,i]:
//                 gemm(N, N, m=hs, n=T, k=T, k,hs, dS,T, dq,hs)
//   dk = dS^T q   dk^T[d,j] = sum_i q[i,d] dS[i,j] = (q^T . dS)[d,j]:
//                 gemm(N, T, m=hs, n=T, k=T, q,hs, dS,T, dk,hs)
// Batch strides: T*hs for q/k/v/yh and their gradients, T*T for S/att/datt.
// The full T x T products are computed; the causal softmax writes 0 above the diagonal, so
// the products with att / dS are exact without masking.
// ---------------------------------------------------------------------------------------
#include "ds/nn/gpt_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "ds/core/cuda_check.h"
#include "ds/core/error.h"
#include "attention_blocks.h"
#include "ds/nn/cuda_flash.h"
#include "ds/nn/cuda_kernels.h"
#include "../sampling.h"

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
           "GptCuda: " << what << " = " << v << " does not fit a cuBLAS int argument");
  return int(v);
}

}  // namespace

struct GptCuda::Impl {
  struct LayerIdx { std::size_t ln1w, ln1b, qkvw, qkvb, projw, projb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb; };
  // Saved activations of one block (dt elements, LayerNorm statistics fp32).
  struct LayerAct {
    void *ln1, *qkv, *att, *atty, *x1, *ln2, *fch, *fch_gelu;
    float *ln1_mean, *ln1_rstd, *ln2_mean, *ln2_rstd;
    float* att_lse;  // flash attention: the softmax log-sum-exp per (b, h, t); att is then null
  };

  Gpt twin;  // parameters(), init_parameters(), flops: never bound, never run
  GptConfig cfg;
  bool allow_tf32;
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;

  // Parameter indices (the order of Gpt's constructor; checked against the names).
  std::size_t wte = 0, wpe = 1, lnfw = 0, lnfb = 0;
  std::vector<LayerIdx> layers;

  // Bound engine storage (device pointers, working dtype dt).
  bool bound = false;
  DType dt = DType::F32;
  std::vector<void*> w, g;
  GroupHooks* hooks = nullptr;  // ZeRO-3 brackets (GroupUse); groups as twin's

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
  std::int64_t att_block() const { return attention.block; }
  // p + n elements of the working dtype.
  void* at(void* p, std::int64_t n) const { return static_cast<char*>(p) + n * std::int64_t(dtype_size(dt)); }
  const void* at(const void* p, std::int64_t n) const {
    return static_cast<const char*>(p) + n * std::int64_t(dtype_size(dt));
  }

  // Activation arena (one cudaMalloc), sized for cap_bt rows and cap_t positions in arena_dt.
  char* arena = nullptr;
  DType arena_dt = DType::F32;
  bool arena_flash = false;
  std::int64_t cap_bt = 0, cap_t = 0;
  std::vector<LayerAct> acts;
  std::vector<void*> resid;  // n_layer + 1 residual streams [N, C]
  void *lnf = nullptr, *logits = nullptr;
  void *q = nullptr, *k = nullptr, *v = nullptr, *yh = nullptr;  // [B,NH,T,hs], shared by layers
  // Backward (shared across layers).
  void *dres = nullptr, *dln = nullptr, *dfch = nullptr, *dqkv = nullptr, *datty = nullptr,
       *dyh = nullptr, *dq = nullptr, *dk = nullptr, *dv = nullptr, *datt = nullptr;
  float *lnf_mean = nullptr, *lnf_rstd = nullptr, *lse = nullptr, *losses = nullptr,
        *d_loss = nullptr, *scratch = nullptr;
  std::int32_t *d_tokens = nullptr, *d_targets = nullptr;

  // Pinned host staging: tokens [cap], targets [cap], loss.
  void* pinned = nullptr;
  std::int64_t pinned_cap = 0;
  std::int32_t *h_tokens = nullptr, *h_targets = nullptr;
  float* h_loss = nullptr;

  std::int64_t B = 0, T = 0;
  bool have_cache = false;

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
      : twin(c), cfg(c), allow_tf32(tf32), attention(att) {
    DS_CHECK(att.block >= 1, "GptCuda: attention block " << att.block << " rows: expected at least 1");
  }

  void init() {
    // Parameter indices, as Gpt's constructor registers them; verified by name.
    const auto infos = twin.parameters();
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

    DS_CUDA_CHECK(cudaGetDevice(&device));
    DS_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DS_CUBLAS_CHECK(cublasCreate(&blas));
    DS_CUBLAS_CHECK(cublasSetStream(blas, stream));
    DS_CUBLAS_CHECK(cublasSetPointerMode(blas, CUBLAS_POINTER_MODE_HOST));
    // Reductions (split-K) in the fp32 compute type, never in the 16-bit output type: the
    // weight gradients accumulate into the engine's gradients with one rounding.
    DS_CUBLAS_CHECK(cublasSetMathMode(
        blas, cublasMath_t(CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    DS_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
    DS_CUBLAS_CHECK(cublasSetWorkspace(blas, workspace, kWorkspaceBytes));
  }

  ~Impl() {
    // No throwing here: errors are ignored (a failed run has reported them already).
    if (stream) (void)cudaStreamSynchronize(stream);
    for (cudaEvent_t e : events) (void)cudaEventDestroy(e);
    if (arena) (void)cudaFree(arena);
    if (pinned) (void)cudaFreeHost(pinned);
    if (blas) (void)cublasDestroy(blas);
    if (workspace) (void)cudaFree(workspace);
    if (stream) (void)cudaStreamDestroy(stream);
  }

  // ---- cuBLAS helpers (row-major derivations in the header comment) ----
  cudaDataType_t ctype() const {
    switch (dt) {
      case DType::F16: return CUDA_R_16F;
      case DType::BF16: return CUDA_R_16BF;
      default: return CUDA_R_32F;
    }
  }
  cublasComputeType_t compute() const {
    if (dt == DType::F32 && allow_tf32) return CUBLAS_COMPUTE_32F_FAST_TF32;
    return CUBLAS_COMPUTE_32F;
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
  // dinp[N,C] = dout[N,OC] w[OC,C]
  void linear_dinp(void* dinp, const void* dout, const void* wt, std::int64_t N, std::int64_t C, std::int64_t OC) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, wt, C, dout, OC, dinp, C, 0.0f);
  }
  // dw[OC,C] += dout[N,OC]^T inp[N,C]
  void linear_dw(void* dw, const void* dout, const void* inp, std::int64_t N, std::int64_t C, std::int64_t OC) {
    gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, dw, C, 1.0f);
  }

  // ---- activations ----
  void ensure(std::int64_t Bn, std::int64_t Tn) {
    const std::int64_t BT = Bn * Tn;
    flash = use_flash();
    if (arena && BT <= cap_bt && Tn <= cap_t && arena_dt == dt && arena_flash == flash) return;
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
    arena_flash = flash;
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
    // Attention probabilities: B*NH*T*T = (BT)*NH*T <= cap_bt*NH*cap_t (none with flash).
    const std::int64_t att = flash ? 0 : N * NH * cap_t;
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
    lnf_mean = tf(N); lnf_rstd = tf(N); lse = tf(N); losses = tf(N); d_loss = tf(1);
    // fp32 scratch, used by one kernel at a time (all on one stream): the embedding's
    // V*C accumulator, LayerNorm / bias reductions, the fp32 row of logits_last.
    std::size_t sf = std::size_t(V * C);
    sf = std::max(sf, kc::layernorm_scratch_floats(N, C));
    for (std::int64_t oc : {C, 3 * C, 4 * C}) sf = std::max(sf, kc::bias_scratch_floats(N, oc));
    sf = std::max(sf, std::size_t(V));
    if (flash) sf = std::max(sf, kc::flash_backward_scratch_floats(N / std::max<std::int64_t>(cap_t, 1) * NH, cap_t, C / NH));
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

  // Gpt::run_forward on the device; tokens already in d_tokens.
  void run_forward(std::int64_t Bn, std::int64_t Tn) {
    const std::int64_t C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size, N = Bn * Tn;
    const std::int64_t hs = C / NH, BNH = Bn * NH, TT = Tn * Tn;
    const float att_scale = 1.0f / std::sqrt(float(hs));
    B = Bn;
    T = Tn;
    {
      GroupUse use(hooks, 0, Pass::Forward);
      Scope op(this, "embedding fwd");
      kc::embedding_forward(resid[0], d_tokens, w[wte], w[wpe], Bn, Tn, C, dt, stream);
    }
    for (std::size_t l = 0; l < layers.size(); ++l) {
      GroupUse use(hooks, l + 1, Pass::Forward);
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
      {
        // Attention: scores into att, softmax in place, yh = att v, heads merged into atty.
        Scope op(this, "attention fwd");
        kc::split_qkv(q, k, v, a.qkv, Bn, Tn, C, NH, dt, stream);
        if (flash) {
          kc::flash_attention_forward(yh, a.att_lse, q, k, v, BNH, Tn, hs, att_scale, dt, stream);
        } else {
          // Block-causal (see att_block): for the query rows [q0, q0 + nq) only keys < q0 + nq.
          const std::int64_t Bq = std::min(att_block(), Tn);
          for (std::int64_t q0 = 0; q0 < Tn; q0 += Bq) {  // S[q0.., 0..kend) = q k^T
            const std::int64_t nq = std::min(Bq, Tn - q0), kend = q0 + nq;
            gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, kend, nq, hs, k, hs, Tn * hs, at(q, q0 * hs), hs, Tn * hs,
                         at(a.att, q0 * Tn), Tn, TT, BNH);
          }
          kc::causal_softmax_forward_blocks(a.att, a.att, att_scale, BNH, Tn, Bq, dt, stream);
          for (std::int64_t q0 = 0; q0 < Tn; q0 += Bq) {  // yh[q0..] = att[q0.., 0..kend) v
            const std::int64_t nq = std::min(Bq, Tn - q0), kend = q0 + nq;
            gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, nq, kend, v, hs, Tn * hs, at(a.att, q0 * Tn), Tn, TT,
                         at(yh, q0 * hs), hs, Tn * hs, BNH);
          }
        }
        kc::merge_heads(a.atty, yh, Bn, Tn, C, NH, dt, stream);
      }
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

  void check_bound(const char* who) const {
    DS_CHECK(bound, "GptCuda::" << who << ": bind() the parameters first");
  }

  float loss_forward(const Batch& batch, const char* who) {
    check_bound(who);
    const std::int64_t Bn = batch.batch, Tn = batch.seq, V = cfg.vocab_size;
    DS_CHECK(Bn > 0 && Tn > 0, "GptCuda::" << who << ": batch (" << Bn << ") and seq (" << Tn << ") must be > 0");
    DS_CHECK(Tn <= cfg.block_size, "GptCuda::" << who << ": seq " << Tn << " exceeds block_size " << cfg.block_size);
    const std::size_t N = std::size_t(Bn * Tn);
    DS_CHECK(batch.inputs.size() == N && batch.targets.size() == N,
             "GptCuda::" << who << ": inputs/targets must hold batch*seq = " << N << " tokens, got "
                         << batch.inputs.size() << "/" << batch.targets.size());
    for (std::size_t i = 0; i < N; ++i) {
      const std::int32_t a = batch.inputs[i], b = batch.targets[i];
      DS_CHECK(a >= 0 && a < V && b >= 0 && b < V,
               "GptCuda::" << who << ": token id out of range [0, " << V << ") at position " << i << " (input "
                           << a << ", target " << b << ")");
    }
    ensure(Bn, Tn);
    upload(batch.inputs.data(), batch.targets.data(), std::int64_t(N));
    run_forward(Bn, Tn);
    {
      Scope op(this, "cross-entropy fwd");
      kc::crossentropy_forward(losses, lse, logits, d_targets, std::int64_t(N), V, dt, stream);
      kc::mean(d_loss, losses, std::int64_t(N), stream);
    }
    DS_CUDA_CHECK(cudaMemcpyAsync(h_loss, d_loss, sizeof(float), cudaMemcpyDeviceToHost, stream));
    DS_CUDA_CHECK(cudaStreamSynchronize(stream));
    return *h_loss;
  }

  // Gpt::backward on the device, the same grad_ready order.
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
    DS_CHECK(have_cache, "GptCuda::backward: call forward() first (evaluate() and generation do not "
                         "keep activations for backward)");
    have_cache = false;
    auto ready = [&](std::size_t i) {
      if (grad_ready) grad_ready(i);
    };
    const std::int64_t C = cfg.n_embd, NH = cfg.n_head, V = cfg.vocab_size, N = B * T;
    const std::int64_t hs = C / NH, BNH = B * NH, TT = T * T;
    const float att_scale = 1.0f / std::sqrt(float(hs));
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
      ready(lnfw);
      ready(lnfb);
    }
    for (std::size_t li = layers.size(); li-- > 0;) {
      GroupUse use(hooks, li + 1, Pass::Backward);
      const LayerIdx& P = layers[li];
      const LayerAct& a = acts[li];
      // MLP: x2 = x1 + c_proj(gelu(c_fc(ln_2(x1)))); dres holds dL/dx2.
      {
        Scope op(this, "fc proj linear bwd (2 GEMMs)");
        linear_dinp(dfch, dres, w[P.fcprojw], N, 4 * C, C);
        linear_dw(g[P.fcprojw], dres, a.fch_gelu, N, 4 * C, C);
      }
      ready(P.fcprojw);
      {
        Scope op(this, "bias grad");
        kc::bias_backward(g[P.fcprojb], dres, N, C, scratch, dt, stream);
      }
      ready(P.fcprojb);
      {
        Scope op(this, "gelu bwd");
        kc::gelu_backward(dfch, a.fch, dfch, 4 * N * C, dt, stream);
      }
      {
        Scope op(this, "fc linear bwd (2 GEMMs)");
        linear_dinp(dln, dfch, w[P.fcw], N, C, 4 * C);
        linear_dw(g[P.fcw], dfch, a.ln2, N, C, 4 * C);
      }
      ready(P.fcw);
      {
        Scope op(this, "bias grad");
        kc::bias_backward(g[P.fcb], dfch, N, 4 * C, scratch, dt, stream);
      }
      ready(P.fcb);
      {
        Scope op(this, "layernorm bwd");
        kc::layernorm_backward(dres, g[P.ln2w], g[P.ln2b], dln, a.x1, w[P.ln2w], a.ln2_mean, a.ln2_rstd, N, C,
                               scratch, dt, stream);
      }
      ready(P.ln2w);
      ready(P.ln2b);
      // Attention: x1 = x + c_proj(attn(c_attn(ln_1(x)))); dres holds dL/dx1.
      {
        Scope op(this, "attn proj linear bwd (2 GEMMs)");
        linear_dinp(datty, dres, w[P.projw], N, C, C);
        linear_dw(g[P.projw], dres, a.atty, N, C, C);
      }
      ready(P.projw);
      {
        Scope op(this, "bias grad");
        kc::bias_backward(g[P.projb], dres, N, C, scratch, dt, stream);
      }
      ready(P.projb);
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
        const std::int64_t Bq = std::min(att_block(), T);
        for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // datt[q0.., 0..kend) = dyh v^T
          const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
          gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, kend, nq, hs, v, hs, T * hs, at(dyh, q0 * hs), hs, T * hs,
                       at(datt, q0 * T), T, TT, BNH);
        }
        for (std::int64_t k0 = 0; k0 < T; k0 += Bq) {  // dv[k0..] = att[k0.., k0..k0+nk)^T dyh[k0..]
          const std::int64_t nk = std::min(Bq, T - k0);
          gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, nk, T - k0, at(dyh, k0 * hs), hs, T * hs, at(a.att, k0 * T + k0), T,
                       TT, at(dv, k0 * hs), hs, T * hs, BNH);
        }
        kc::causal_softmax_backward_blocks(datt, a.att, datt, att_scale, BNH, T, Bq, dt, stream);  // datt -> dS
        for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // dq[q0..] = dS[q0.., 0..kend) k
          const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
          gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, nq, kend, k, hs, T * hs, at(datt, q0 * T), T, TT, at(dq, q0 * hs),
                       hs, T * hs, BNH);
        }
        for (std::int64_t k0 = 0; k0 < T; k0 += Bq) {  // dk[k0..] = dS[k0.., k0..k0+nk)^T q[k0..]
          const std::int64_t nk = std::min(Bq, T - k0);
          gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, nk, T - k0, at(q, k0 * hs), hs, T * hs, at(datt, k0 * T + k0), T,
                       TT, at(dk, k0 * hs), hs, T * hs, BNH);
        }
        kc::merge_qkv(dqkv, dq, dk, dv, B, T, C, NH, dt, stream);
      }
      {
        Scope op(this, "qkv linear bwd (2 GEMMs)");
        linear_dinp(dln, dqkv, w[P.qkvw], N, C, 3 * C);
        linear_dw(g[P.qkvw], dqkv, a.ln1, N, C, 3 * C);
      }
      ready(P.qkvw);
      {
        Scope op(this, "bias grad");
        kc::bias_backward(g[P.qkvb], dqkv, N, 3 * C, scratch, dt, stream);
      }
      ready(P.qkvb);
      {
        Scope op(this, "layernorm bwd");
        kc::layernorm_backward(dres, g[P.ln1w], g[P.ln1b], dln, resid[li], w[P.ln1w], a.ln1_mean, a.ln1_rstd, N, C,
                               scratch, dt, stream);
      }
      ready(P.ln1w);
      ready(P.ln1b);
    }
    GroupUse use(hooks, 0, Pass::Backward);
    {
      Scope op(this, "embedding bwd");
      kc::embedding_backward(g[wte], g[wpe], dres, d_tokens, B, T, C, V, scratch, dt, stream);
    }
    ready(wpe);
    ready(wte);
  }

  std::vector<float> logits_last(std::span<const std::int32_t> context) {
    DS_CHECK(!context.empty(), "GptCuda::logits_last: empty context");
    check_bound("logits_last");
    have_cache = false;
    const std::int64_t V = cfg.vocab_size;
    const std::size_t Tn = std::min<std::size_t>(context.size(), std::size_t(cfg.block_size));
    const std::int32_t* tok = context.data() + (context.size() - Tn);
    for (std::size_t i = 0; i < Tn; ++i)
      DS_CHECK(tok[i] >= 0 && tok[i] < V, "GptCuda::logits_last: token " << tok[i] << " outside [0, " << V << ")");
    ensure(1, std::int64_t(Tn));
    upload(tok, nullptr, std::int64_t(Tn));
    run_forward(1, std::int64_t(Tn));
    const char* row = static_cast<const char*>(logits) + std::size_t(std::int64_t(Tn) - 1) * std::size_t(V) * dtype_size(dt);
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

GptCuda::GptCuda(const GptConfig& cfg, bool allow_tf32, const GptCudaAttention& attention)
    : impl_(std::make_unique<Impl>(cfg, allow_tf32, attention)) {
  impl_->init();  // on failure impl_'s destructor releases what init() created
}

GptCuda::~GptCuda() = default;

std::vector<ParamInfo> GptCuda::parameters() const { return impl_->twin.parameters(); }

std::vector<ParamGroup> GptCuda::parameter_groups() const { return impl_->twin.parameter_groups(); }

void GptCuda::set_group_hooks(GroupHooks* hooks) { impl_->hooks = hooks; }

void GptCuda::init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) {
  impl_->twin.init_parameters(params, seed);
}

void GptCuda::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  Impl& m = *impl_;
  const auto infos = m.twin.parameters();
  DS_CHECK(params.size() == infos.size() && grads.size() == infos.size(),
           "GptCuda::bind: expected " << infos.size() << " parameter and gradient views, got " << params.size()
                                      << " and " << grads.size());
  DS_CHECK(!params.empty(), "GptCuda::bind: no parameters");
  const DType dt = params[0].dtype;
  DS_CHECK(dt == DType::F32 || dt == DType::F16 || dt == DType::BF16,
           "GptCuda::bind: working dtype must be fp32, fp16 or bf16, got " << dtype_name(dt));
  auto check_view = [&](const TensorView& t, const ParamInfo& info, const char* kind) {
    DS_CHECK(t.dtype == dt, "GptCuda::bind: all parameters and gradients must share one dtype: "
                                << kind << " of '" << info.name << "' is " << dtype_name(t.dtype) << ", '"
                                << infos[0].name << "' is " << dtype_name(dt));
    DS_CHECK(t.count == info.numel(), "GptCuda::bind: " << kind << " of '" << info.name << "' has " << t.count
                                                        << " elements, expected " << info.numel());
    DS_CHECK(t.data != nullptr, "GptCuda::bind: " << kind << " of '" << info.name << "' is null");
    cudaPointerAttributes attr{};
    DS_CUDA_CHECK(cudaPointerGetAttributes(&attr, t.data));
    DS_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
             "GptCuda::bind: " << kind << " of '" << info.name << "' is not device memory");
    DS_CHECK(attr.device == m.device, "GptCuda::bind: " << kind << " of '" << info.name << "' lives on device "
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

float GptCuda::forward(const Batch& batch) {
  impl_->have_cache = false;
  const float loss = impl_->loss_forward(batch, "forward");
  impl_->have_cache = true;
  return loss;
}

void GptCuda::backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
  impl_->backward(scale, grad_ready);
}

float GptCuda::evaluate(const Batch& batch) {
  impl_->have_cache = false;
  return impl_->loss_forward(batch, "evaluate");
}

void* GptCuda::device_stream() const { return static_cast<void*>(impl_->stream); }

void GptCuda::set_profiling(bool on) {
  impl_->take_profile();  // drops nothing: folds what is pending into the totals
  impl_->profiling = on;
  impl_->prof.reset();
}

std::vector<GptCuda::OpTime> GptCuda::profile() {
  impl_->take_profile();
  return impl_->prof.rows();
}

const GptConfig& GptCuda::config() const { return impl_->cfg; }

std::size_t GptCuda::num_parameters() const { return impl_->twin.num_parameters(); }

double GptCuda::flops_per_token(std::int64_t seq) const { return impl_->twin.flops_per_token(seq); }

std::vector<float> GptCuda::logits_last(std::span<const std::int32_t> context) {
  return impl_->logits_last(context);
}

// The sampler of Gpt::generate (src/nn/src/sampling.h): the same logits give the same tokens.
std::vector<std::int32_t> GptCuda::generate(std::span<const std::int32_t> context, int n_new, float temperature,
                                            std::uint64_t seed) {
  return sample_tokens(context, n_new, temperature, seed,
                       [this](std::span<const std::int32_t> ctx) { return logits_last(ctx); });
}

}  // namespace ds::nn
