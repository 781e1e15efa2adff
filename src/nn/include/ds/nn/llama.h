// Llama-style decoder on the CPU (pre-RMSNorm blocks, rotary position embeddings in HF's
// rotate_half convention, grouped-query attention, SwiGLU MLP, no biases, tied or untied LM
// head), implementing ds::Module as the GPT does. Parameters: llama_parameters(cfg)
// (ds/nn/llama_layout.h), Hugging Face LlamaForCausalLM names and layouts.
//
// Each op runs over the whole batch on the kernels' own threads (the GPT's per-thread
// sequence split and gradient partials are not done here). Binding, the groups, the arena's
// growth, checkpointing, the loss and sampling are Decoder's (ds/nn/decoder.h). Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ds/nn/decoder.h"
#include "ds/nn/llama_layout.h"

namespace ds::nn {

class Llama : public Decoder {
 public:
  explicit Llama(const LlamaConfig& cfg);  // validates cfg (see validate(LlamaConfig))

  bool init_parameter_range(std::size_t first, std::span<const std::span<float>> params, std::uint64_t seed) override;

  // The config with intermediate_size resolved.
  const LlamaConfig& config() const { return cfg_; }

  // Training FLOPs per token: 6 * (weights in GEMMs, the LM head included) + 12 * n_layer * T * C
  // for attention's QK^T and PV (2 GEMMs x 2 FLOPs x T x C per layer, x3 for forward and
  // backward; T = seq, default block_size), as Gpt::flops_per_token.
  double flops_per_token(std::int64_t seq = 0) const override;

 private:
  using LayerIdx = LlamaIndex::Layer;
  struct LayerAct { float *ln1, *rstd1, *q, *k, *v, *att, *atty, *x1, *ln2, *rstd2, *gate, *up, *h; };
  void ensure_scratch(std::int64_t B, std::int64_t T) override;
  std::int64_t arena_floats(std::int64_t N, std::int64_t T, int slots, bool checkpointing) const override;
  // Decoder layer l's forward over the batch run_layers set up (B_ x T_).
  void layer_forward(std::size_t l);
  void run_layers(const std::int32_t* tokens, std::int64_t B, std::int64_t T, std::size_t first,
                  std::size_t last) override;
  void run_backward(float scale, const std::function<void(std::size_t)>& grad_ready, std::size_t first,
                    std::size_t last) override;
  // The head's backward (the loss, the LM head, the final norm) into dres_.
  void head_backward(float scale, const std::function<void(std::size_t)>& done, bool with_embedding);
  void add_forward_macs(ModuleProfile& out, std::int64_t B, std::int64_t T) const override {
    add_llama_forward_macs(cfg_, modules_, B, T, out);
  }
  // With group hooks (ZeRO-3): half dtypes convert group g's parameters inside its bracket.
  void prepare_group(std::size_t g);
  std::size_t final_group() const { return groups_.size() - 1; }
  std::size_t head_group() const { return cfg_.tie_embeddings ? 0 : final_group(); }

  LlamaConfig cfg_;
  std::int64_t hd_ = 0, kv_ = 0;  // head dim, n_kv_head * hd
  std::size_t embed_ = 0, normf_ = 0, head_ = 0;  // head_ == embed_ when tied
  std::vector<LayerIdx> layers_;

  // Activations and backward scratch, carved from Decoder's arena.
  std::vector<LayerAct> acts_;
  float *lnf_ = nullptr, *rstdf_ = nullptr;
  float *dln_ = nullptr, *datty_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr,
        *dgate_ = nullptr, *dup_ = nullptr, *dh_ = nullptr, *datt_scratch_ = nullptr;
  std::vector<float> rope_cos_, rope_sin_;  // [block_size, hd / 2]
};

}  // namespace ds::nn
