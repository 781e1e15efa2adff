// DecoderCuda: what the CUDA decoders (GptCuda, LlamaCuda) share around their layer math. Each
// model's Impl derives from it and adds its parameter indices, its activation layout and its
// forward / backward sequence; this part owns the device, the stream, the cuBLAS handle, the
// GEMMs in the working dtype, the bound engine views, the activation arena and the pinned
// host staging of tokens and the loss. Internal to ds_nn (not installed).
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
//         gemm(N, N, m=C, n=N, k=OC, A=w,C, B=dout,OC, C=dinp,C)         beta 0 (1: accumulate)
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
//
// Block-causal: the query rows [q0, q0 + nq) of a block multiply only the keys < q0 + nq, and
// the key rows [k0, k0 + nk) are seen only by the queries >= k0, so the GEMMs skip the upper
// block triangle of [T, T] (at T = 1024 and 256-row blocks they do 10/16 of the full products).
// The causal softmax writes 0 above the diagonal inside the diagonal blocks, so the products
// with att / dS there are exact without masking.
// ---------------------------------------------------------------------------------------
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ds/core/cuda_check.h"
#include "ds/core/dtype.h"
#include "ds/core/error.h"
#include "ds/core/module.h"
#include "ds/nn/decoder.h"

#define DS_CUBLAS_CHECK(call)                                                                 \
  do {                                                                                        \
    cublasStatus_t ds_cublas_st_ = (call);                                                    \
    if (ds_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                               \
      DS_THROW("cuBLAS call " #call " failed: " << cublasGetStatusName(ds_cublas_st_) << " (" \
                                                << cublasGetStatusString(ds_cublas_st_) << ")"); \
  } while (0)

namespace ds::nn::cuda {

class DecoderCuda {
 public:
  // model: the class name in error messages ("GptCuda"). allow_tf32: fp32 GEMMs may use TF32.
  // vocab, block_size: the token checks' bounds. att_block: query rows per block of the
  // block-causal attention (checked >= 1).
  DecoderCuda(const char* model, bool allow_tf32, std::int64_t vocab, std::int64_t block_size,
              std::int64_t att_block);
  // Waits for the stream, then frees the arena, the pinned staging, cuBLAS and the stream.
  // Never throws (a failed run has reported its error already).
  virtual ~DecoderCuda();
  DecoderCuda(const DecoderCuda&) = delete;
  DecoderCuda& operator=(const DecoderCuda&) = delete;

  // ---- the model's part ----
  // The CPU model mirrored (parameters, initialisation, groups, FLOPs): never bound, never run.
  virtual Decoder& twin() = 0;
  // Makes the arena hold Bn x Tn (layout through grow_arena).
  virtual void ensure(std::int64_t Bn, std::int64_t Tn) = 0;
  // The forward of Bn x Tn tokens already in d_tokens, up to the logits.
  virtual void run_forward(std::int64_t Bn, std::int64_t Tn) = 0;
  virtual void backward(float scale, const std::function<void(std::size_t)>& grad_ready) = 0;
  // The per-row losses of the logits against d_targets and their mean into d_loss.
  virtual void loss_kernels(std::int64_t N);

  // ---- the steps every decoder takes the same way ----
  // Checks, uploads and runs the forward, returns the mean loss. who: "forward" or "evaluate".
  float loss_forward(const Batch& batch, const char* who);
  std::vector<float> logits_last(std::span<const std::int32_t> context);
  // backward()'s start: throws unless forward() kept the activations; drops them.
  void take_cache();

  // Once, from the model's init(): the device current now, a non-blocking stream, a cuBLAS
  // handle on it with its workspace.
  void open_device();

  // ---- the engine's views (Module::bind) ----
  // Checks every view against `infos` (count, one fp32/fp16/bf16 dtype, device memory on this
  // model's device) and keeps their pointers in w / g; the working dtype becomes dt.
  void bind_views(std::span<const ParamInfo> infos, std::span<const TensorView> params,
                  std::span<const TensorView> grads);
  void check_bound(const char* who) const;

  // ---- GEMMs in the working dtype with fp32 accumulation (derivations above) ----
  void gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k,
            const void* A, std::int64_t lda, const void* B, std::int64_t ldb, void* C, std::int64_t ldc, float beta);
  void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k,
                    const void* A, std::int64_t lda, std::int64_t sa, const void* B, std::int64_t ldb,
                    std::int64_t sb, void* C, std::int64_t ldc, std::int64_t sc, std::int64_t batch);
  // out[N,OC] = inp[N,C] w[OC,C]^T
  void linear_fwd(void* out, const void* inp, const void* wt, std::int64_t N, std::int64_t C, std::int64_t OC);
  // dinp[N,C] (beta 0: =, 1: +=) dout[N,OC] w[OC,C]
  void linear_dinp(void* dinp, const void* dout, const void* wt, std::int64_t N, std::int64_t C, std::int64_t OC,
                   float beta = 0.0f);
  // dw[OC,C] += dout[N,OC]^T inp[N,C]
  void linear_dw(void* dw, const void* dout, const void* inp, std::int64_t N, std::int64_t C, std::int64_t OC);

  // ---- block-causal attention GEMMs over BNH heads of [T, hs], T = this->T, blocks of Bq rows ----
  // att = q k^T (the blocks each query block sees)
  void attention_scores(void* att, const void* q, const void* k, std::int64_t hs, std::int64_t Bq, std::int64_t BNH);
  // y = att v
  void attention_values(void* y, const void* att, const void* v, std::int64_t hs, std::int64_t Bq, std::int64_t BNH);
  // Before the softmax backward: datt = dy v^T and dv = att^T dy.
  void attention_values_backward(void* datt, void* dv, const void* dy, const void* att, const void* v,
                                 std::int64_t hs, std::int64_t Bq, std::int64_t BNH);
  // After it (dS in dS): dq = dS k and dk = dS^T q.
  void attention_scores_backward(void* dq, void* dk, const void* dS, const void* q, const void* k, std::int64_t hs,
                                 std::int64_t Bq, std::int64_t BNH);

  // ---- activations and staging ----
  // p + n elements of the working dtype.
  void* at(void* p, std::int64_t n) const { return static_cast<char*>(p) + n * std::int64_t(dtype_size(dt)); }
  const void* at(const void* p, std::int64_t n) const {
    return static_cast<const char*>(p) + n * std::int64_t(dtype_size(dt));
  }
  // Whether the arena already holds Bn*Tn rows and Tn positions in the working dtype.
  bool arena_fits(std::int64_t Bn, std::int64_t Tn) const {
    return arena && Bn * Tn <= cap_bt && Tn <= cap_t && arena_dt == dt;
  }
  // Carves the arena in a layout: with base null it only counts the bytes (off).
  struct Carve {
    char* base;
    std::size_t es;  // bytes per working-dtype element
    std::size_t off = 0;
    char* bytes(std::size_t b) {
      char* r = base ? base + off : nullptr;
      off += (b + kAlign - 1) / kAlign * kAlign;
      return r;
    }
    void* elems(std::int64_t n) { return bytes(std::size_t(n) * es); }
    float* floats(std::int64_t n) { return reinterpret_cast<float*>(bytes(std::size_t(n) * 4)); }
  };
  Carve carve(char* base) const { return Carve{base, dtype_size(dt)}; }
  // The arrays every layout ends with: the losses, the fp32 scratch of scratch_floats (at least
  // a row of logits), the tokens and targets. Returns the bytes carved in all.
  std::size_t carve_tail(Carve& c, std::size_t scratch_floats);
  // Grows the capacities to cover Bn x Tn and re-carves the arena: layout(nullptr) counts the
  // bytes, layout(base) carves them (the model's pointers into it); grows the pinned staging.
  // Waits for the stream before freeing the old arena.
  void grow_arena(std::int64_t Bn, std::int64_t Tn, const std::function<std::size_t(char*)>& layout);
  // Copies N tokens (and targets, when given) to d_tokens / d_targets through pinned memory.
  void upload(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t N);
  // Synchronises the stream and returns *d_value.
  float read_scalar(const float* d_value);
  // Row `row` of the [*, V] logits as fp32 on the host (through scratch when dt is 16-bit);
  // synchronises the stream.
  std::vector<float> logits_row(const void* logits, std::int64_t row, std::int64_t V, float* scratch);

  const char* model;
  bool allow_tf32;
  std::int64_t vocab, block_size, att_block;
  int device = -1;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;

  // Bound engine storage (device pointers, working dtype dt).
  bool bound = false;
  DType dt = DType::F32;
  std::vector<void*> w, g;
  GroupHooks* hooks = nullptr;  // ZeRO-3 brackets (GroupUse)

  // Activation arena (one cudaMalloc) for cap_bt rows and cap_t positions in arena_dt; the
  // model's layout carves it, d_tokens / d_targets included.
  char* arena = nullptr;
  DType arena_dt = DType::F32;
  std::int64_t cap_bt = 0, cap_t = 0;
  std::int32_t *d_tokens = nullptr, *d_targets = nullptr;

  // Pinned host staging: the loss, tokens [cap], targets [cap].
  void* pinned = nullptr;
  std::int64_t pinned_cap = 0;
  std::int32_t *h_tokens = nullptr, *h_targets = nullptr;
  float* h_loss = nullptr;

  // What every layout carves (carve_tail; logits and lse by the model, in the working dtype / fp32).
  void* logits = nullptr;
  float *lse = nullptr, *losses = nullptr, *d_loss = nullptr, *scratch = nullptr;

  std::int64_t B = 0, T = 0;  // the shape of the last forward
  bool have_cache = false;    // forward() kept the activations backward() needs

  static constexpr std::size_t kAlign = 256;  // every arena array starts on this boundary

 private:
  int to_int(std::int64_t v, const char* what) const;
  cudaDataType_t ctype() const;
  cublasComputeType_t compute() const;
};

}  // namespace ds::nn::cuda
