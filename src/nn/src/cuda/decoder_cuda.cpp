// DecoderCuda (decoder_cuda.h): the device, cuBLAS, bound views, arena and staging shared by
// GptCuda and LlamaCuda.
#include "decoder_cuda.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <string>

#include "../decoder_io.h"
#include "../sampling.h"
#include "ds/nn/cuda_decoder.h"
#include "ds/nn/cuda_kernels.h"

namespace ds::nn::cuda {

namespace {
constexpr std::size_t kWorkspaceBytes = std::size_t(32) << 20;  // cuBLAS workspace
}  // namespace

DecoderCuda::DecoderCuda(const char* model, bool allow_tf32, std::int64_t vocab, std::int64_t block_size,
                         std::int64_t att_block)
    : model(model), allow_tf32(allow_tf32), vocab(vocab), block_size(block_size), att_block(att_block) {
  DS_CHECK(att_block >= 1, model << ": attention block " << att_block << " rows: expected at least 1");
}

DecoderCuda::~DecoderCuda() {
  if (stream) (void)cudaStreamSynchronize(stream);
  if (arena) (void)cudaFree(arena);
  if (pinned) (void)cudaFreeHost(pinned);
  if (blas) (void)cublasDestroy(blas);
  if (workspace) (void)cudaFree(workspace);
  if (stream) (void)cudaStreamDestroy(stream);
}

void DecoderCuda::open_device() {
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

// ---- bound views and input checks ----

void DecoderCuda::bind_views(std::span<const ParamInfo> infos, std::span<const TensorView> params,
                             std::span<const TensorView> grads) {
  DS_CHECK(params.size() == infos.size() && grads.size() == infos.size(),
           model << "::bind: expected " << infos.size() << " parameter and gradient views, got " << params.size()
                 << " and " << grads.size());
  DS_CHECK(!params.empty(), model << "::bind: no parameters");
  const DType wdt = params[0].dtype;
  DS_CHECK(wdt == DType::F32 || wdt == DType::F16 || wdt == DType::BF16,
           model << "::bind: working dtype must be fp32, fp16 or bf16, got " << dtype_name(wdt));
  auto check_view = [&](const TensorView& t, const ParamInfo& info, const char* kind) {
    DS_CHECK(t.dtype == wdt, model << "::bind: all parameters and gradients must share one dtype: " << kind
                                   << " of '" << info.name << "' is " << dtype_name(t.dtype) << ", '"
                                   << infos[0].name << "' is " << dtype_name(wdt));
    DS_CHECK(t.count == info.numel(), model << "::bind: " << kind << " of '" << info.name << "' has " << t.count
                                            << " elements, expected " << info.numel());
    DS_CHECK(t.data != nullptr, model << "::bind: " << kind << " of '" << info.name << "' is null");
    cudaPointerAttributes attr{};
    DS_CUDA_CHECK(cudaPointerGetAttributes(&attr, t.data));
    DS_CHECK(attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged,
             model << "::bind: " << kind << " of '" << info.name << "' is not device memory");
    DS_CHECK(attr.device == device, model << "::bind: " << kind << " of '" << info.name << "' lives on device "
                                          << attr.device << ", the model on device " << device);
  };
  for (std::size_t i = 0; i < infos.size(); ++i) {
    check_view(params[i], infos[i], "parameter");
    check_view(grads[i], infos[i], "gradient");
  }
  w.resize(infos.size());
  g.resize(infos.size());
  for (std::size_t i = 0; i < infos.size(); ++i) {
    w[i] = params[i].data;
    g[i] = grads[i].data;
  }
  dt = wdt;
  bound = true;
  have_cache = false;
}

void DecoderCuda::check_bound(const char* who) const {
  DS_CHECK(bound, model << "::" << who << ": bind() the parameters first");
}

// ---- the steps every decoder takes the same way ----

void DecoderCuda::loss_kernels(std::int64_t N) {
  crossentropy_forward(losses, lse, logits, d_targets, N, vocab, dt, stream);
  mean(d_loss, losses, N, stream);
}

float DecoderCuda::loss_forward(const Batch& batch, const char* who) {
  check_bound(who);
  const std::string where = std::string(model) + "::" + who;
  const std::size_t N = detail::check_batch(batch, block_size, vocab, where.c_str());
  ensure(batch.batch, batch.seq);
  upload(batch.inputs.data(), batch.targets.data(), std::int64_t(N));
  run_forward(batch.batch, batch.seq);
  loss_kernels(std::int64_t(N));
  return read_scalar(d_loss);
}

std::vector<float> DecoderCuda::logits_last(std::span<const std::int32_t> context) {
  const std::string where = std::string(model) + "::logits_last";
  const auto tok = detail::context_window(context, block_size, vocab, where.c_str());
  check_bound("logits_last");
  have_cache = false;
  const auto Tn = std::int64_t(tok.size());
  ensure(1, Tn);
  upload(tok.data(), nullptr, Tn);
  run_forward(1, Tn);
  return logits_row(logits, Tn - 1, vocab, scratch);
}

void DecoderCuda::take_cache() {
  DS_CHECK(have_cache, model << "::backward: call forward() first (evaluate() and generation do not "
                                "keep activations for backward)");
  have_cache = false;
}

std::size_t DecoderCuda::carve_tail(Carve& c, std::size_t scratch_floats) {
  const std::int64_t N = cap_bt;
  losses = c.floats(N);
  d_loss = c.floats(1);
  scratch = c.floats(std::int64_t(std::max(scratch_floats, std::size_t(vocab))));
  d_tokens = reinterpret_cast<std::int32_t*>(c.bytes(std::size_t(N) * 4));
  d_targets = reinterpret_cast<std::int32_t*>(c.bytes(std::size_t(N) * 4));
  return c.off;
}

// ---- GEMMs ----

int DecoderCuda::to_int(std::int64_t v, const char* what) const {
  DS_CHECK(v >= 0 && v <= std::int64_t(INT_MAX),
           model << ": " << what << " = " << v << " does not fit a cuBLAS int argument");
  return int(v);
}

cudaDataType_t DecoderCuda::ctype() const {
  switch (dt) {
    case DType::F16: return CUDA_R_16F;
    case DType::BF16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

cublasComputeType_t DecoderCuda::compute() const {
  return dt == DType::F32 && allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
}

void DecoderCuda::gemm(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n, std::int64_t k,
                       const void* A, std::int64_t lda, const void* Bm, std::int64_t ldb, void* Cm, std::int64_t ldc,
                       float beta) {
  const float alpha = 1.0f;
  DS_CUBLAS_CHECK(cublasGemmEx(blas, ta, tb, to_int(m, "m"), to_int(n, "n"), to_int(k, "k"), &alpha, A, ctype(),
                               to_int(lda, "lda"), Bm, ctype(), to_int(ldb, "ldb"), &beta, Cm, ctype(),
                               to_int(ldc, "ldc"), compute(), CUBLAS_GEMM_DEFAULT));
}

void DecoderCuda::gemm_batched(cublasOperation_t ta, cublasOperation_t tb, std::int64_t m, std::int64_t n,
                               std::int64_t k, const void* A, std::int64_t lda, std::int64_t sa, const void* Bm,
                               std::int64_t ldb, std::int64_t sb, void* Cm, std::int64_t ldc, std::int64_t sc,
                               std::int64_t batch) {
  const float alpha = 1.0f, beta = 0.0f;
  DS_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      blas, ta, tb, to_int(m, "m"), to_int(n, "n"), to_int(k, "k"), &alpha, A, ctype(), to_int(lda, "lda"),
      (long long)sa, Bm, ctype(), to_int(ldb, "ldb"), (long long)sb, &beta, Cm, ctype(), to_int(ldc, "ldc"),
      (long long)sc, to_int(batch, "batch"), compute(), CUBLAS_GEMM_DEFAULT));
}

void DecoderCuda::linear_fwd(void* out, const void* inp, const void* wt, std::int64_t N, std::int64_t C,
                             std::int64_t OC) {
  gemm(CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, wt, C, inp, C, out, OC, 0.0f);
}

void DecoderCuda::linear_dinp(void* dinp, const void* dout, const void* wt, std::int64_t N, std::int64_t C,
                              std::int64_t OC, float beta) {
  gemm(CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, wt, C, dout, OC, dinp, C, beta);
}

void DecoderCuda::linear_dw(void* dw, const void* dout, const void* inp, std::int64_t N, std::int64_t C,
                            std::int64_t OC) {
  gemm(CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp, C, dout, OC, dw, C, 1.0f);
}

// ---- block-causal attention GEMMs ----

void DecoderCuda::attention_scores(void* att, const void* q, const void* k, std::int64_t hs, std::int64_t Bq,
                                   std::int64_t BNH) {
  const std::int64_t TT = T * T;
  for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // S[q0.., 0..kend) = q k^T
    const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
    gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, kend, nq, hs, k, hs, T * hs, at(q, q0 * hs), hs, T * hs, at(att, q0 * T),
                 T, TT, BNH);
  }
}

void DecoderCuda::attention_values(void* y, const void* att, const void* v, std::int64_t hs, std::int64_t Bq,
                                   std::int64_t BNH) {
  const std::int64_t TT = T * T;
  for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // y[q0..] = att[q0.., 0..kend) v
    const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, nq, kend, v, hs, T * hs, at(att, q0 * T), T, TT, at(y, q0 * hs), hs,
                 T * hs, BNH);
  }
}

void DecoderCuda::attention_values_backward(void* datt, void* dv, const void* dy, const void* att, const void* v,
                                            std::int64_t hs, std::int64_t Bq, std::int64_t BNH) {
  const std::int64_t TT = T * T;
  for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // datt[q0.., 0..kend) = dy v^T
    const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
    gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, kend, nq, hs, v, hs, T * hs, at(dy, q0 * hs), hs, T * hs,
                 at(datt, q0 * T), T, TT, BNH);
  }
  for (std::int64_t k0 = 0; k0 < T; k0 += Bq) {  // dv[k0..] = att[k0.., k0..k0+nk)^T dy[k0..]
    const std::int64_t nk = std::min(Bq, T - k0);
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, nk, T - k0, at(dy, k0 * hs), hs, T * hs, at(att, k0 * T + k0), T, TT,
                 at(dv, k0 * hs), hs, T * hs, BNH);
  }
}

void DecoderCuda::attention_scores_backward(void* dq, void* dk, const void* dS, const void* q, const void* k,
                                            std::int64_t hs, std::int64_t Bq, std::int64_t BNH) {
  const std::int64_t TT = T * T;
  for (std::int64_t q0 = 0; q0 < T; q0 += Bq) {  // dq[q0..] = dS[q0.., 0..kend) k
    const std::int64_t nq = std::min(Bq, T - q0), kend = q0 + nq;
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, hs, nq, kend, k, hs, T * hs, at(dS, q0 * T), T, TT, at(dq, q0 * hs), hs,
                 T * hs, BNH);
  }
  for (std::int64_t k0 = 0; k0 < T; k0 += Bq) {  // dk[k0..] = dS[k0.., k0..k0+nk)^T q[k0..]
    const std::int64_t nk = std::min(Bq, T - k0);
    gemm_batched(CUBLAS_OP_N, CUBLAS_OP_T, hs, nk, T - k0, at(q, k0 * hs), hs, T * hs, at(dS, k0 * T + k0), T, TT,
                 at(dk, k0 * hs), hs, T * hs, BNH);
  }
}

// ---- arena and staging ----

void DecoderCuda::grow_arena(std::int64_t Bn, std::int64_t Tn, const std::function<std::size_t(char*)>& layout) {
  cap_bt = std::max(cap_bt, Bn * Tn);
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

void DecoderCuda::upload(const std::int32_t* tokens, const std::int32_t* targets, std::int64_t N) {
  std::memcpy(h_tokens, tokens, std::size_t(N) * 4);
  DS_CUDA_CHECK(cudaMemcpyAsync(d_tokens, h_tokens, std::size_t(N) * 4, cudaMemcpyHostToDevice, stream));
  if (targets) {
    std::memcpy(h_targets, targets, std::size_t(N) * 4);
    DS_CUDA_CHECK(cudaMemcpyAsync(d_targets, h_targets, std::size_t(N) * 4, cudaMemcpyHostToDevice, stream));
  }
}

float DecoderCuda::read_scalar(const float* d_value) {
  DS_CUDA_CHECK(cudaMemcpyAsync(h_loss, d_value, sizeof(float), cudaMemcpyDeviceToHost, stream));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return *h_loss;
}

std::vector<float> DecoderCuda::logits_row(const void* logits, std::int64_t row, std::int64_t V, float* scratch) {
  const void* src = at(logits, row * V);
  if (dt != DType::F32) {
    convert(scratch, DType::F32, src, dt, V, stream);
    src = scratch;
  }
  std::vector<float> out(static_cast<std::size_t>(V));
  DS_CUDA_CHECK(cudaMemcpyAsync(out.data(), src, std::size_t(V) * sizeof(float), cudaMemcpyDeviceToHost, stream));
  DS_CUDA_CHECK(cudaStreamSynchronize(stream));
  return out;
}

}  // namespace ds::nn::cuda

namespace ds::nn {

// ---- CudaDecoder: the Module side, through the model's DecoderCuda ----

CudaDecoder::CudaDecoder(std::unique_ptr<cuda::DecoderCuda> impl) : impl_(std::move(impl)) {}

CudaDecoder::~CudaDecoder() = default;

std::vector<ParamInfo> CudaDecoder::parameters() const { return impl_->twin().parameters(); }

std::vector<ParamGroup> CudaDecoder::parameter_groups() const { return impl_->twin().parameter_groups(); }

void CudaDecoder::set_group_hooks(GroupHooks* hooks) { impl_->hooks = hooks; }

void CudaDecoder::init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) {
  impl_->twin().init_parameters(params, seed);
}

void CudaDecoder::bind(std::span<const TensorView> params, std::span<const TensorView> grads) {
  impl_->bind_views(impl_->twin().parameters(), params, grads);
}

float CudaDecoder::forward(const Batch& batch) {
  impl_->have_cache = false;
  const float loss = impl_->loss_forward(batch, "forward");
  impl_->have_cache = true;
  return loss;
}

void CudaDecoder::backward(float scale, const std::function<void(std::size_t)>& grad_ready) {
  impl_->backward(scale, grad_ready);
}

float CudaDecoder::evaluate(const Batch& batch) {
  impl_->have_cache = false;
  return impl_->loss_forward(batch, "evaluate");
}

void* CudaDecoder::device_stream() const { return static_cast<void*>(impl_->stream); }

std::size_t CudaDecoder::num_parameters() const { return impl_->twin().num_parameters(); }

double CudaDecoder::flops_per_token(std::int64_t seq) const { return impl_->twin().flops_per_token(seq); }

std::vector<float> CudaDecoder::logits_last(std::span<const std::int32_t> context) {
  return impl_->logits_last(context);
}

// The CPU models' sampler (sampling.h): the same logits give the same tokens.
std::vector<std::int32_t> CudaDecoder::generate(std::span<const std::int32_t> context, int n_new, float temperature,
                                                std::uint64_t seed) {
  return sample_tokens(context, n_new, temperature, seed,
                       [this](std::span<const std::int32_t> ctx) { return logits_last(ctx); });
}

}  // namespace ds::nn
