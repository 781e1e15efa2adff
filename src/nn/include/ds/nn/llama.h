// Llama-style decoder on the CPU (pre-RMSNorm blocks, rotary position embeddings in HF's
// rotate_half convention, grouped-query attention, SwiGLU MLP, no biases, tied or untied LM
// head), implementing ds::Module as the GPT does. Parameters: llama_parameters(cfg)
// (ds/nn/llama_layout.h), Hugging Face LlamaForCausalLM names and layouts.
//
// Each op runs over the whole batch on the kernels' own threads (the GPT's per-thread
// sequence split and gradient partials are not done here). Activations are sized at the first
// forward for a batch x seq and grown only when a larger one arrives. Not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "ds/core/buffer.h"
#include "ds/core/module.h"
#include "ds/nn/gemm.h"
#include "ds/nn/llama_layout.h"
#include "ds/nn/params.h"

namespace ds::nn {

class Llama : public Module {
 public:
  explicit Llama(const LlamaConfig& cfg);  // validates cfg (see validate(LlamaConfig))

  std::vector<ParamInfo> parameters() const override { return ps_.infos(); }
  void init_parameters(std::span<const std::span<float>> params, std::uint64_t seed) override;
  bool init_parameter_range(std::size_t first, std::span<const std::span<float>> params, std::uint64_t seed) override;
  void bind(std::span<const TensorView> params, std::span<const TensorView> grads) override;
  float forward(const Batch& batch) override;
  void backward(float scale, const std::function<void(std::size_t)>& grad_ready) override;
  float evaluate(const Batch& batch) override;
  // ZeRO-3 groups in execution order: "embed" (model.embed_tokens), "h.0" .. "h.{n_layer-1}"
  // (a decoder layer each), "final" (model.norm, and lm_head when untied). A tied head
  // acquires "embed" again (forward and backward).
  std::vector<ParamGroup> parameter_groups() const override { return groups_; }
  // The model brackets with the ParamSet's hooks: they wrap these and keep the fp32 shadows
  // of half dtypes to the groups in use (ParamSet::set_group_hooks).
  void set_group_hooks(GroupHooks* hooks) override { hooks_ = ps_.set_group_hooks(hooks, groups_); }
  // Host bytes of the fp32 parameter/gradient shadows (half dtypes; ParamSet::shadow_bytes).
  std::size_t shadow_bytes() const { return ps_.shadow_bytes(); }

  // The config with intermediate_size resolved.
  const LlamaConfig& config() const { return cfg_; }
  // Activation checkpointing and the activation arena's size, as Gpt's: forward keeps each
  // decoder layer's input and one layer's activations; backward recomputes a layer's
  // activations just before its backward (inside its group bracket). Same bits either way.
  void set_activation_checkpointing(bool on);
  bool activation_checkpointing() const { return ckpt_; }
  std::size_t activation_bytes(std::int64_t B, std::int64_t T) const { return activation_bytes(B, T, ckpt_); }
  std::size_t activation_bytes(std::int64_t B, std::int64_t T, bool checkpointing) const;
  std::size_t arena_bytes() const { return arena_.count() * sizeof(float); }
  // GEMM precision of the Linear layers, chosen at bind() as the GPT's (layer_precision()).
  void set_gemm_precision(Precision p) { prec_ = p; prec_fixed_ = true; }
  Precision gemm_precision() const { return prec_; }
  std::size_t num_parameters() const { return ps_.total_numel(); }

  // Training FLOPs per token: 6 * (weights in GEMMs, the LM head included) + 12 * n_layer * T * C
  // for attention's QK^T and PV (2 GEMMs x 2 FLOPs x T x C per layer, x3 for forward and
  // backward; T = seq, default block_size), as Gpt::flops_per_token.
  double flops_per_token(std::int64_t seq = 0) const;

  // Logits (vocab_size floats) for the token after `context` (its last block_size tokens), and
  // sampling as Gpt::generate (the same sampler). Overwrite the cached activations.
  std::vector<float> logits_last(std::span<const std::int32_t> context);
  std::vector<std::int32_t> generate(std::span<const std::int32_t> context, int n_new,
                                     float temperature, std::uint64_t seed);

 private:
  using LayerIdx = LlamaIndex::Layer;
  struct LayerAct { float *ln1, *rstd1, *q, *k, *v, *att, *atty, *x1, *ln2, *rstd2, *gate, *up, *h; };
  void ensure_scratch(std::int64_t B, std::int64_t T);
  std::int64_t arena_floats(std::int64_t N, std::int64_t T, int slots, bool checkpointing) const;
  // Decoder layer l's forward over the batch run_forward set up (B_ x T_).
  void layer_forward(std::size_t l);
  void run_forward(const std::int32_t* tokens, std::int64_t B, std::int64_t T);
  // With group hooks (ZeRO-3): half dtypes convert group g's parameters inside its bracket.
  void prepare_group(std::size_t g);
  std::size_t final_group() const { return groups_.size() - 1; }
  std::size_t head_group() const { return cfg_.tie_embeddings ? 0 : final_group(); }
  float loss_forward(const Batch& batch);

  LlamaConfig cfg_;
  std::int64_t hd_ = 0, kv_ = 0;  // head dim, n_kv_head * hd
  ParamSet ps_;
  std::size_t embed_ = 0, normf_ = 0, head_ = 0;  // head_ == embed_ when tied
  std::vector<LayerIdx> layers_;
  std::vector<ParamGroup> groups_;
  GroupHooks* hooks_ = nullptr;

  HostBuffer arena_;
  std::int64_t cap_bt_ = 0, cap_t_ = 0;
  int att_slots_ = 0;
  bool ckpt_ = false, arena_ckpt_ = false;  // activation checkpointing: wanted / how arena_ is laid out
  std::vector<LayerAct> acts_;
  std::vector<float*> resid_;  // n_layer + 1 residual streams [BT, C]
  float *lnf_ = nullptr, *rstdf_ = nullptr, *logits_ = nullptr, *lse_ = nullptr;
  float *dres_ = nullptr, *dln_ = nullptr, *datty_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr,
        *dgate_ = nullptr, *dup_ = nullptr, *dh_ = nullptr, *datt_scratch_ = nullptr;
  std::vector<float> rope_cos_, rope_sin_;  // [block_size, hd / 2]
  std::vector<std::int32_t> tokens_, targets_;
  std::int64_t B_ = 0, T_ = 0;
  bool have_cache_ = false;
  Precision prec_ = Precision::F32;
  bool prec_fixed_ = false;
};

}  // namespace ds::nn
