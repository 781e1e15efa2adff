// make_model: one branch per built-in model, each building the CPU or the GPU version.
#include "ds/nn/model_factory.h"

#include <cstdio>

#include "ds/core/error.h"
#include "ds/nn/gemm.h"
#include "ds/nn/gpt.h"
#include "ds/nn/llama.h"
#include "ds/nn/mlp.h"
#if DS_NN_HAVE_CUDA
#include <cuda_runtime.h>

#include "ds/core/cuda_check.h"
#include "ds/nn/gpt_cuda.h"
#include "ds/nn/llama_cuda.h"
#endif

namespace ds::nn {

namespace {

#if DS_NN_HAVE_CUDA
constexpr bool kHaveCuda = true;
#else
constexpr bool kHaveCuda = false;
#endif

// The MLP classifies the next token from the one-hot encoding of the last block_size tokens
// (one prediction per sequence). Keeps its buffers: the Batch it returns points into them.
class MlpBatcher {
 public:
  MlpBatcher(std::int64_t seq, std::int64_t vocab) : seq_(seq), vocab_(vocab) {}
  Batch operator()(const Batch& tokens) {
    const std::int64_t B = tokens.batch;
    features_.assign(std::size_t(B * seq_ * vocab_), 0.0f);
    targets_.resize(std::size_t(B));
    for (std::int64_t b = 0; b < B; ++b) {
      for (std::int64_t t = 0; t < seq_; ++t)
        features_[std::size_t((b * seq_ + t) * vocab_ + tokens.inputs[std::size_t(b * seq_ + t)])] = 1.0f;
      targets_[std::size_t(b)] = tokens.targets[std::size_t(b * seq_ + seq_ - 1)];
    }
    Batch out;
    out.features = features_;
    out.targets = targets_;
    out.batch = B;
    out.feature_dim = seq_ * vocab_;
    return out;
  }

 private:
  std::int64_t seq_, vocab_;
  std::vector<float> features_;
  std::vector<std::int32_t> targets_;
};

// The decoders' common hooks: sampler and FLOPs, and with checkpointing on, recomputation
// switched on and the line that reports its arena.
template <class M>
BuiltModel finish_decoder(std::unique_ptr<M> m, const ModelSpec& spec, const ModelCheckpointing& ckpt) {
  BuiltModel b;
  M* raw = m.get();
  b.generate = [raw](auto ctx, int n, float temp, std::uint64_t seed) { return raw->generate(ctx, n, temp, seed); };
  b.flops_per_token = raw->flops_per_token();
  if constexpr (requires { raw->set_activation_checkpointing(true); }) {
    if (ckpt.enabled) {
      raw->set_activation_checkpointing(true);
      b.checkpointing_note = [raw, B = ckpt.micro_batch, T = spec.block_size] {
        char line[160];
        std::snprintf(line, sizeof line,
                      "on: activation arena %.1f MiB per micro-batch of %lld x %lld tokens (%.1f MiB without)",
                      double(raw->activation_bytes(B, T)) / 1048576.0, static_cast<long long>(B),
                      static_cast<long long>(T), double(raw->activation_bytes(B, T, false)) / 1048576.0);
        return std::string(line);
      };
    }
  }
  b.module = std::move(m);
  return b;
}

GptConfig gpt_config(const ModelSpec& s) {
  GptConfig g;
  g.n_layer = s.n_layer;
  g.n_head = s.n_head;
  g.n_embd = s.n_embd;
  g.block_size = s.block_size;
  g.vocab_size = s.vocab_size;
  return g;
}

LlamaConfig llama_config(const ModelSpec& s) {
  LlamaConfig c;
  c.n_layer = s.n_layer;
  c.n_head = s.n_head;
  c.n_kv_head = s.n_kv_head;
  c.n_embd = s.n_embd;
  c.intermediate_size = s.intermediate_size;
  c.block_size = s.block_size;
  c.vocab_size = s.vocab_size;
  c.rope_theta = s.rope_theta;
  c.rms_norm_eps = s.rms_norm_eps;
  c.tie_embeddings = s.tie_embeddings;
  return c;
}

#if DS_NN_HAVE_CUDA
BuiltModel make_gpu_model(const ModelSpec& spec, int device, const ModelKernels& kernels) {
  DS_CUDA_CHECK(cudaSetDevice(device));
  if (spec.type == "gpt") {
    // kernels.attention: "auto" is the materialised path (faster than flash at GPT-2 124M
    // on an H200, docs/dev/gpu.md); "flash" where the dtype and head size allow.
    GptCudaAttention att;
    att.flash = kernels.attention == "flash";
    att.block = kernels.attention_block;
    return finish_decoder(std::make_unique<GptCuda>(gpt_config(spec), /*allow_tf32=*/false, att), spec, {});
  }
  // Compiled, not yet run on a GPU (docs/dev/gpu.md): materialised block-causal attention
  // only, so kernels.attention "flash" is refused rather than silently not used.
  DS_CHECK(kernels.attention != "flash", kernels.source << ": kernels.attention \"flash\": the CUDA Llama has no "
                                                           "flash attention; use \"auto\" or add --device cpu");
  return finish_decoder(
      std::make_unique<LlamaCuda>(llama_config(spec), /*allow_tf32=*/false, kernels.attention_block), spec, {});
}
#endif

BuiltModel make_cpu_model(const ModelSpec& spec, const ModelKernels& kernels, const ModelCheckpointing& ckpt) {
  if (spec.type == "mlp") {
    // On feature arrays (in_features > 0) it reads the batch as it is; on tokens through the batcher.
    const bool features = spec.in_features > 0;
    MlpConfig m;
    m.in_features = features ? spec.in_features : spec.block_size * spec.vocab_size;
    m.hidden = spec.n_embd;
    m.n_classes = spec.vocab_size;
    m.n_hidden_layers = spec.n_layer;
    auto mlp = std::make_unique<Mlp>(m);
    BuiltModel b;
    if (ckpt.enabled) b.checkpointing_note = [] { return std::string("no effect on --model mlp (it has no blocks to recompute)"); };
    // FLOPs per sample spread over the block_size tokens a sample reads (a sample of arrays: one "token").
    b.flops_per_token = mlp->flops_per_sample() / double(features ? 1 : spec.block_size);
    if (!features)
      b.adapt_batch = [batcher = std::make_shared<MlpBatcher>(spec.block_size, spec.vocab_size)](const Batch& t) {
        return (*batcher)(t);
      };
    b.module = std::move(mlp);
    return b;
  }
  // kernels.cpu_bf16_gemm checked now, where a bad value is one agreed error line; the
  // choice itself is agreed between the ranks at the start of training.
  (void)parse_cpu_bf16_gemm(kernels.cpu_bf16_gemm, "kernels.cpu_bf16_gemm");
  BuiltModel b = spec.type == "gpt" ? finish_decoder(std::make_unique<Gpt>(gpt_config(spec)), spec, ckpt)
                                    : finish_decoder(std::make_unique<Llama>(llama_config(spec)), spec, ckpt);
  b.cpu_bf16_gemm = true;
  return b;
}

}  // namespace

bool model_on_gpu(const ModelSpec& spec, const std::string& device_flag) {
  // The Llama's GPU model (LlamaCuda) is compiled but has not run on a GPU yet: only an
  // explicit --device cuda takes it; --device auto keeps the Llama on the CPU.
  if (device_flag == "cpu" || (device_flag == "auto" && spec.type == "llama")) return false;
#if DS_NN_HAVE_CUDA
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) cudaGetLastError();  // no driver: leave no sticky error behind
  const bool visible = rc == cudaSuccess && count > 0;
  if (device_flag == "cuda") {
    DS_CHECK(visible, "--device cuda: no CUDA device is visible ("
                          << (rc != cudaSuccess ? cudaGetErrorString(rc) : "0 devices") << ")");
  }
  return visible;
#else
  DS_CHECK(device_flag != "cuda", "--device cuda: this train was built without CUDA (DS_WITH_CUDA)");
  return false;
#endif
}

std::string gpu_device_name(int device) {
#if DS_NN_HAVE_CUDA
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    return "cuda:" + std::to_string(device) + " (" + prop.name + ")";
#endif
  return "cuda:" + std::to_string(device);
}

BuiltModel make_model(const ModelSpec& spec, bool on_gpu, int device, const ModelKernels& kernels,
                      const ModelCheckpointing& checkpointing) {
  const bool gpu_model = spec.type == "gpt" || (kHaveCuda && spec.type == "llama");
  const char* gpu_models = kHaveCuda ? "the GPU path has the GPT and the Llama" : "the GPU path has the GPT";
  if (on_gpu && !gpu_model)
    DS_THROW("--model " << spec.type << " runs on the CPU only; add --device cpu (" << gpu_models << ")");
  // DeepSpeed recomputes where the model calls checkpoint(); here the built-in CPU decoders do
  // it for every block when the config's section (or the flag) asks.
  if (checkpointing.enabled && on_gpu)
    DS_THROW(checkpointing.from << ": the CUDA " << (spec.type == "llama" ? "Llama" : "GPT")
                                << " does not recompute activations; remove it or add --device cpu");
#if DS_NN_HAVE_CUDA
  if (on_gpu) return make_gpu_model(spec, device, kernels);
#else
  (void)device;
#endif
  return make_cpu_model(spec, kernels, checkpointing);
}

}  // namespace ds::nn
